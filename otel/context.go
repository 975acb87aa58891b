package otel

import (
	"context"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Context plumbing. Each acquisition keeps this Observer's state for the
// session in the context AcquireStart returns; the engine hands that
// context (or one derived from it, perhaps by other Observers) to every
// later hook of the session. The context keys hold the Observer, so that
// composed Observers each find their own state.

type (
	sessionKey struct{ o *Observer }
	opKey      struct{ o *Observer }
	batchKey   struct{ o *Observer }
	// scopeKey finds the innermost span this package put in a context, of
	// any Observer, with the context it was started from.
	scopeKey struct{}
)

// scope is a span this package put in a context and the context it was
// started from.
type scope struct {
	span   trace.Span
	parent context.Context
}

// callerContext strips from ctx the spans Observers of this package put
// there, so that composed Observers' spans are siblings, children of the
// caller's span, rather than children of one another's.
func callerContext(ctx context.Context) context.Context {
	if ctx == nil {
		return context.Background()
	}
	for {
		sc, ok := ctx.Value(scopeKey{}).(*scope)
		if !ok || !trace.SpanContextFromContext(ctx).Equal(sc.span.SpanContext()) {
			return ctx
		}
		ctx = sc.parent
	}
}

// sessionCtx is the context AcquireStart returns and the per-session state.
type sessionCtx struct {
	context.Context // the hook's context with the acquire span
	o               *Observer
	sc              scope
	span            trace.Span
	tab             *attrTable
	extra           []attribute.KeyValue              // from WithMetricAttributesFn
	active          atomic.Bool                       // counted in dislock.session.active
	renew           atomic.Pointer[trace.SpanContext] // the last renewal call's span
}

func (c *sessionCtx) Value(k any) any {
	switch k := k.(type) {
	case sessionKey:
		if k.o == c.o {
			return c
		}
	case scopeKey:
		return &c.sc
	}
	return c.Context.Value(k)
}

func (o *Observer) sessionFrom(ctx context.Context) *sessionCtx {
	if ctx == nil {
		return nil
	}
	st, _ := ctx.Value(sessionKey{o}).(*sessionCtx)
	return st
}

// opCtx is the context ReleaseStart returns.
type opCtx struct {
	context.Context
	o    *Observer
	st   *sessionCtx // nil when AcquireStart did not run on this chain
	span trace.Span
}

func (c *opCtx) Value(k any) any {
	if k, ok := k.(opKey); ok && k.o == c.o {
		return c
	}
	return c.Context.Value(k)
}

func (o *Observer) opFrom(ctx context.Context) *opCtx {
	op, _ := ctx.Value(opKey{o}).(*opCtx)
	return op
}

// batchCtx is the context RenewBatchStart returns.
type batchCtx struct {
	context.Context
	o     *Observer
	span  trace.Span // nil when renew spans are off
	links []trace.Link
	start time.Time
}

func (c *batchCtx) Value(k any) any {
	if k, ok := k.(batchKey); ok && k.o == c.o {
		return c
	}
	return c.Context.Value(k)
}
