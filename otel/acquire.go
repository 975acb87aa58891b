package otel

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/trace"

	"github.com/dislock/dislock/core"
)

// isTimeout reports whether err is an acquisition that ended with its ctx.
func isTimeout(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// AcquireStart implements core.Observer: it starts the dislock.acquire span
// as a child of the span in ctx, the caller's.
func (o *Observer) AcquireStart(ctx context.Context, e core.AcquireStartEvent) context.Context {
	parent := callerContext(ctx)
	st := &sessionCtx{o: o, tab: o.table(e.Backend, modeOf(e.Mode), e.Slot)}
	_, st.span = o.tracer.Start(parent, SpanAcquire, trace.WithAttributes(o.spanAttrs(e.Backend, st, e.Key, 0, 0)...))
	st.sc = scope{span: st.span, parent: parent}
	st.Context = trace.ContextWithSpan(ctx, st.span)
	if o.attrsFn != nil {
		st.extra = o.attrsFn(e.Key)
	}
	return st
}

// AcquireEnd implements core.Observer: it ends the acquire span and records
// dislock.acquire.duration; an acquired session joins
// dislock.session.active.
func (o *Observer) AcquireEnd(ctx context.Context, e core.AcquireEndEvent) {
	st := o.sessionFrom(ctx)
	tracked := st != nil // later hooks find the session's state
	if !tracked {        // AcquireStart did not run on this context's chain
		st = &sessionCtx{o: o, span: trace.SpanFromContext(context.Background()), tab: o.table(e.Backend, modeOf(e.Mode), e.Slot)}
		if o.attrsFn != nil {
			st.extra = o.attrsFn(e.Key)
		}
	}
	var (
		outcome string
		cached  mopts
	)
	switch {
	case e.Err == nil:
		outcome, cached = OutcomeAcquired, st.tab.acquired
	case errors.Is(e.Err, core.ErrNotAcquired) && isTimeout(e.Err):
		outcome, cached = OutcomeTimeout, st.tab.timeout
	case errors.Is(e.Err, core.ErrNotAcquired):
		outcome, cached = OutcomeBusy, st.tab.busy
	default:
		outcome = OutcomeError
	}
	span := st.span
	if span.IsRecording() {
		span.SetAttributes(AttrOutcome.String(outcome), AttrAttempts.Int(e.Attempts))
		if e.Session != nil && e.Session.Token() != 0 {
			span.SetAttributes(AttrToken.String(tokenString(e.Session.Token())))
		}
		switch e.Wake {
		case core.WakeNotify:
			span.SetAttributes(AttrWake.String(WakeNotification))
		case core.WakePoll:
			span.SetAttributes(AttrWake.String(WakePoll))
		}
		if h := e.Holder; h != nil {
			span.SetAttributes(AttrHolderOwner.String(h.Owner))
			if h.Token != 0 {
				span.SetAttributes(AttrHolderToken.String(tokenString(h.Token)))
			}
			if h.Remaining > 0 {
				span.SetAttributes(AttrHolderRemaining.Float64(h.Remaining.Seconds()))
			}
		}
		if outcome == OutcomeError {
			o.fail(span, e.Err, e.Key)
		}
	}
	span.End()
	if outcome == OutcomeError {
		o.acquireDur.Record(ctx, e.Wait.Seconds(), st.tab.measure(mopts{}, st.extra,
			AttrOutcome.String(outcome), AttrErrorType.String(core.ErrorType(e.Err))).rec...)
	} else {
		o.acquireDur.Record(ctx, e.Wait.Seconds(), st.tab.measure(cached, st.extra).rec...)
	}
	// Only a session whose end this Observer will see counts as active.
	if tracked && e.Err == nil && e.Session != nil && st.active.CompareAndSwap(false, true) {
		o.active.Add(ctx, 1, st.tab.measure(st.tab.session, st.extra).add...)
	}
}
