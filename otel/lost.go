package otel

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/trace"

	"github.com/dislock/dislock/core"
)

// Lost implements core.Observer: it emits a dislock.lease_lost span, the
// root of a new trace linked to the session's acquire span (and to the
// last renewal call's span), counts dislock.lease.lost and ends the
// session's metrics.
func (o *Observer) Lost(ctx context.Context, e core.LostEvent) {
	st := o.sessionFrom(ctx)
	reason, cachedLost := LostDeadline, mopts{}
	if errors.Is(e.Err, core.ErrLeaseGone) {
		reason = LostRefused
	}
	attrs := o.spanAttrs(e.Backend, st, e.Key, e.Token, 2)
	attrs = append(attrs, AttrHeldSeconds.Float64(e.Held.Seconds()), AttrLostReason.String(reason))
	opts := []trace.SpanStartOption{trace.WithNewRoot(), trace.WithAttributes(attrs...)}
	if st != nil {
		if sc := st.span.SpanContext(); sc.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
		}
		if sc := st.renew.Load(); sc != nil {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: *sc}))
		}
	}
	_, span := o.tracer.Start(ctx, SpanLeaseLost, opts...)
	err := e.Err
	if err == nil {
		err = core.ErrLeaseLost
	}
	o.fail(span, err, e.Key)
	span.End()

	if st == nil {
		st = &sessionCtx{o: o, tab: o.table(e.Backend, "", false)}
	}
	if reason == LostRefused {
		cachedLost = st.tab.lostRefused
	} else {
		cachedLost = st.tab.lostDeadline
	}
	o.lost.Add(ctx, 1, st.tab.measure(cachedLost, st.extra).add...)
	o.endSession(ctx, st, e.Held, true)
}
