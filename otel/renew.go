package otel

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/dislock/dislock/core"
)

// RenewStart implements core.Observer. Renewals are reported per call, by
// RenewBatchStart and RenewBatchEnd: it returns ctx.
func (o *Observer) RenewStart(ctx context.Context, _ core.RenewStartEvent) context.Context {
	return ctx
}

// RenewEnd implements core.Observer. Renewals are reported per call, by
// RenewBatchStart and RenewBatchEnd: it does nothing.
func (o *Observer) RenewEnd(context.Context, core.RenewEndEvent) {}

// RenewBatchStart implements core.RenewBatchObserver: unless renew spans
// are off it starts a dislock.renew span for the call, the root of a new
// trace, linked to the acquire span of every session the call renews.
func (o *Observer) RenewBatchStart(ctx context.Context, e core.RenewBatchStartEvent) context.Context {
	b := &batchCtx{Context: ctx, o: o, start: time.Now(), links: make([]trace.Link, 0, len(e.Renewals))}
	for i, r := range e.Renewals {
		var st *sessionCtx
		if i < len(e.Contexts) {
			st = o.sessionFrom(e.Contexts[i])
		}
		if st == nil || !st.span.SpanContext().IsValid() {
			continue
		}
		b.links = append(b.links, trace.Link{SpanContext: st.span.SpanContext(), Attributes: o.linkAttrs(r.Key, r.Token)})
	}
	if o.renewSpans {
		b.Context, b.span = o.tracer.Start(ctx, SpanRenew, trace.WithNewRoot(), trace.WithTimestamp(b.start),
			trace.WithLinks(b.links...), trace.WithAttributes(o.renewAttrs(e.Backend, len(e.Renewals))...))
		if sc := b.span.SpanContext(); sc.IsValid() {
			for i := range e.Renewals {
				if i < len(e.Contexts) {
					if st := o.sessionFrom(e.Contexts[i]); st != nil {
						st.renew.Store(&sc)
					}
				}
			}
		}
	}
	return b
}

func (o *Observer) linkAttrs(key string, token uint64) []attribute.KeyValue {
	kvs := make([]attribute.KeyValue, 0, 2)
	if kv, ok := o.keyAttr(key); ok {
		kvs = append(kvs, kv)
	}
	if token != 0 {
		kvs = append(kvs, AttrToken.String(tokenString(token)))
	}
	return kvs
}

func (o *Observer) renewAttrs(backend string, n int) []attribute.KeyValue {
	kvs := make([]attribute.KeyValue, 0, len(o.attrs)+2)
	kvs = append(kvs, o.attrs...)
	return append(kvs, AttrBackend.String(BackendName(backend)), AttrRenewSessions.Int(n))
}

// RenewBatchEnd implements core.RenewBatchObserver: it ends the renew span
// (starting one, backdated, for a failed call when renew spans are off) and
// records dislock.renew.duration.
func (o *Observer) RenewBatchEnd(ctx context.Context, e core.RenewBatchEndEvent) {
	now := time.Now()
	b, _ := ctx.Value(batchKey{o}).(*batchCtx)
	if b == nil { // RenewBatchStart did not run on this context's chain
		b = &batchCtx{Context: ctx, o: o, start: now}
	}
	// The call fails when it fails as a whole or for some session without
	// an answer; leases the store refused are lost (and reported by Lost).
	var failure error
	refused := 0
	for _, r := range e.Renewals {
		switch {
		case r.Err == nil:
		case errors.Is(r.Err, core.ErrLeaseLost):
			refused++
		case failure == nil:
			failure = r.Err
		}
	}
	if e.Err != nil {
		failure, refused = e.Err, 0
	}
	outcome := OutcomeRenewed
	switch {
	case failure != nil:
		outcome = OutcomeError
	case refused > 0:
		outcome = OutcomeLost
	}
	span := b.span
	if span == nil && outcome != OutcomeRenewed {
		_, span = o.tracer.Start(ctx, SpanRenew, trace.WithNewRoot(), trace.WithTimestamp(b.start),
			trace.WithLinks(b.links...), trace.WithAttributes(o.renewAttrs(e.Backend, len(e.Renewals))...))
	}
	if span != nil {
		if span.IsRecording() {
			span.SetAttributes(AttrOutcome.String(outcome))
			if refused > 0 {
				span.SetAttributes(AttrRenewLost.Int(refused))
			}
			key := ""
			if len(e.Renewals) == 1 {
				key = e.Renewals[0].Key
			}
			switch {
			case failure != nil:
				o.fail(span, failure, key)
			case refused > 0:
				o.fail(span, core.ErrLeaseLost, key)
			}
		}
		span.End(trace.WithTimestamp(now))
	}
	tab := o.table(e.Backend, "", false)
	d := now.Sub(b.start).Seconds()
	switch outcome {
	case OutcomeRenewed:
		o.renewDur.Record(ctx, d, tab.renewed.rec...)
	case OutcomeLost:
		o.renewDur.Record(ctx, d, tab.measure(mopts{}, nil, AttrOutcome.String(outcome),
			AttrErrorType.String(core.ErrorType(core.ErrLeaseLost))).rec...)
	default:
		o.renewDur.Record(ctx, d, tab.measure(mopts{}, nil, AttrOutcome.String(outcome),
			AttrErrorType.String(core.ErrorType(failure))).rec...)
	}
}
