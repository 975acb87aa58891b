package otel

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/dislock/dislock/core"
)

// endSession takes a session out of dislock.session.active and records
// dislock.session.duration, once per session.
func (o *Observer) endSession(ctx context.Context, st *sessionCtx, held time.Duration, lost bool) {
	if st == nil || !st.active.CompareAndSwap(true, false) {
		return
	}
	o.active.Add(ctx, -1, st.tab.measure(st.tab.session, st.extra).add...)
	if lost {
		o.heldDur.Record(ctx, held.Seconds(), st.tab.measure(st.tab.heldLost, st.extra).rec...)
	} else {
		o.heldDur.Record(ctx, held.Seconds(), st.tab.measure(st.tab.heldReleased, st.extra).rec...)
	}
}

// ReleaseStart implements core.Observer: it starts the dislock.release span
// as a child of the span in the ctx passed to Release (a new root when
// Close releases), linked to the session's acquire span.
func (o *Observer) ReleaseStart(ctx context.Context, e core.ReleaseStartEvent) context.Context {
	op := &opCtx{Context: ctx, o: o, st: o.sessionFrom(ctx)}
	opts := []trace.SpanStartOption{trace.WithAttributes(o.spanAttrs(e.Backend, op.st, e.Key, e.Token, 2)...)}
	if op.st != nil {
		if sc := op.st.span.SpanContext(); sc.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
		}
	}
	_, op.span = o.tracer.Start(callerContext(e.Caller), SpanRelease, opts...)
	return op
}

// ReleaseEnd implements core.Observer: it ends the release span (outcome
// lost, with an error status, when the store no longer had the lease: Lost
// has then reported the loss); the first release of a session takes it out
// of dislock.session.active and records dislock.session.duration.
func (o *Observer) ReleaseEnd(ctx context.Context, e core.ReleaseEndEvent) {
	op := o.opFrom(ctx)
	if op == nil { // ReleaseStart did not run on this context's chain
		o.endSession(ctx, o.sessionFrom(ctx), e.Held, false)
		return
	}
	if span := op.span; span.IsRecording() {
		outcome := OutcomeReleased
		switch {
		case errors.Is(e.Err, core.ErrLeaseLost):
			outcome = OutcomeLost
		case e.Err != nil:
			outcome = OutcomeError
		case e.Kept:
			outcome = OutcomeKept
		}
		span.SetAttributes(AttrOutcome.String(outcome), AttrHeldSeconds.Float64(e.Held.Seconds()))
		if e.Err != nil {
			o.fail(span, e.Err, e.Key)
		}
	}
	op.span.End()
	o.endSession(ctx, op.st, e.Held, false)
}
