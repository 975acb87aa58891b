package otel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/dislock/dislock/core"
)

// Span names.
const (
	SpanAcquire   = "dislock.acquire"
	SpanRenew     = "dislock.renew"
	SpanRelease   = "dislock.release"
	SpanLeaseLost = "dislock.lease_lost"
)

// Metric names.
const (
	MetricAcquireDuration = "dislock.acquire.duration"
	MetricSessionsActive  = "dislock.sessions.active"
	MetricHeldDuration    = "dislock.held.duration"
	MetricRenewDuration   = "dislock.renew.duration"
	MetricLeasesLost      = "dislock.leases.lost"
)

// Attribute keys.
const (
	AttrBackend     = attribute.Key("dislock.backend")
	AttrMode        = attribute.Key("dislock.mode")
	AttrOutcome     = attribute.Key("dislock.outcome")
	AttrKey         = attribute.Key("dislock.key")
	AttrKeySHA256   = attribute.Key("dislock.key.sha256")
	AttrToken       = attribute.Key("dislock.token")
	AttrAttempts    = attribute.Key("dislock.attempts")
	AttrWaitSeconds = attribute.Key("dislock.wait_seconds")
	AttrHeldSeconds = attribute.Key("dislock.held_seconds")
	AttrErrorType   = attribute.Key("error.type")

	attrExceptionType    = attribute.Key("exception.type")
	attrExceptionMessage = attribute.Key("exception.message")
)

// Values of dislock.mode.
const (
	ModeTry  = "try"
	ModeWait = "wait"
	ModeSlot = "slot"
)

// Values of dislock.outcome.
const (
	OutcomeAcquired = "acquired" // acquire
	OutcomeBusy     = "busy"     // acquire: held elsewhere (TryAcquire)
	OutcomeTimeout  = "timeout"  // acquire: ctx ended while waiting (Acquire)
	OutcomeError    = "error"    // acquire, renew, release: a failure
	OutcomeRenewed  = "renewed"  // renew
	OutcomeLost     = "lost"     // renew: refused by the store; held: lease lost
	OutcomeReleased = "released" // release: freed; held: ended by Release or Close
	OutcomeKept     = "kept"     // release: left to expire (MinHold, slot)
)

// Bucket boundaries, in seconds.
var (
	// latencyBuckets cover a round trip to a long wait: 100µs to 30s.
	latencyBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
		0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
	// heldBuckets cover a quick job to a day-long one: 10ms to 24h.
	heldBuckets = []float64{0.01, 0.1, 1, 5, 10, 30, 60, 300, 600, 1800, 3600,
		7200, 21600, 86400}
)

// Observer implements core.Observer with OpenTelemetry spans and metrics.
// Install it with core.WithObserver. It is safe for concurrent use.
type Observer struct {
	tracer     trace.Tracer
	keyMode    KeyMode
	renewSpans bool
	attrsFn    func(string) []attribute.KeyValue

	acquireDur metric.Float64Histogram
	heldDur    metric.Float64Histogram
	renewDur   metric.Float64Histogram
	active     metric.Int64UpDownCounter
	lost       metric.Int64Counter

	mu     sync.RWMutex
	tables map[tableKey]*attrTable
}

var _ core.Observer = (*Observer)(nil)

// New returns an Observer. Without WithTracerProvider and
// WithMeterProvider it uses the global providers.
func New(opts ...Option) (*Observer, error) {
	cfg := config{}
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if cfg.keyMode < KeyRaw || cfg.keyMode > KeyOmitted {
		return nil, errors.New("dislock/otel: WithKey: unknown KeyMode " + strconv.Itoa(int(cfg.keyMode)))
	}
	if cfg.tp == nil {
		cfg.tp = otel.GetTracerProvider()
	}
	if cfg.mp == nil {
		cfg.mp = otel.GetMeterProvider()
	}
	o := &Observer{
		tracer:     cfg.tp.Tracer(ScopeName, trace.WithInstrumentationVersion(Version)),
		keyMode:    cfg.keyMode,
		renewSpans: cfg.renewSpans,
		attrsFn:    cfg.attrsFn,
		tables:     make(map[tableKey]*attrTable),
	}
	m := cfg.mp.Meter(ScopeName, metric.WithInstrumentationVersion(Version))
	var err, e error
	o.acquireDur, e = m.Float64Histogram(MetricAcquireDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of lock acquisitions, including waiting."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	err = errors.Join(err, e)
	o.heldDur, e = m.Float64Histogram(MetricHeldDuration, metric.WithUnit("s"),
		metric.WithDescription("How long sessions held their lock, from acquisition to release or loss."),
		metric.WithExplicitBucketBoundaries(heldBuckets...))
	err = errors.Join(err, e)
	o.renewDur, e = m.Float64Histogram(MetricRenewDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of lease renewals, per session."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	err = errors.Join(err, e)
	o.active, e = m.Int64UpDownCounter(MetricSessionsActive, metric.WithUnit("{session}"),
		metric.WithDescription("Sessions currently held by this process."))
	err = errors.Join(err, e)
	o.lost, e = m.Int64Counter(MetricLeasesLost, metric.WithUnit("{lease}"),
		metric.WithDescription("Leases lost: refused by the store or not renewed in time."))
	err = errors.Join(err, e)
	if err != nil {
		return nil, err
	}
	return o, nil
}

// Context plumbing. Each acquisition keeps its state in the context that
// AcquireStart returns; the engine hands that context (or one derived from
// it) to every later hook of the session.

type ctxKey int

const (
	sessionKey ctxKey = iota
	opKey
)

// sessionCtx is the context AcquireStart returns and the per-session state.
type sessionCtx struct {
	context.Context // the caller's context with the acquire span
	span            trace.Span
	tab             *attrTable
	extra           []attribute.KeyValue // from WithMetricAttributesFn
	active          atomic.Bool          // counted in dislock.sessions.active
}

func (c *sessionCtx) Value(k any) any {
	if k == any(sessionKey) {
		return c
	}
	return c.Context.Value(k)
}

func sessionFrom(ctx context.Context) *sessionCtx {
	st, _ := ctx.Value(sessionKey).(*sessionCtx)
	return st
}

// opCtx is the context RenewStart and ReleaseStart return.
type opCtx struct {
	context.Context
	st    *sessionCtx // nil when AcquireStart did not run on this chain
	span  trace.Span  // nil when no span was started
	start time.Time
}

func (c *opCtx) Value(k any) any {
	if k == any(opKey) {
		return c
	}
	return c.Context.Value(k)
}

func opFrom(ctx context.Context) *opCtx {
	op, _ := ctx.Value(opKey).(*opCtx)
	return op
}

// Metric attribute sets, built once per (backend, mode).

type tableKey struct{ backend, mode string }

type mopts struct {
	rec []metric.RecordOption
	add []metric.AddOption
}

func newMopts(kvs ...attribute.KeyValue) mopts {
	o := metric.WithAttributeSet(attribute.NewSet(kvs...))
	return mopts{rec: []metric.RecordOption{o}, add: []metric.AddOption{o}}
}

type attrTable struct {
	backend, mode string
	session       mopts // backend, mode
	acquired      mopts
	busy          mopts
	timeout       mopts
	renewed       mopts
	heldReleased  mopts
	heldLost      mopts
}

func (o *Observer) table(backend, mode string) *attrTable {
	k := tableKey{backend, mode}
	o.mu.RLock()
	t := o.tables[k]
	o.mu.RUnlock()
	if t != nil {
		return t
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if t = o.tables[k]; t != nil {
		return t
	}
	b, m := AttrBackend.String(backend), AttrMode.String(mode)
	t = &attrTable{
		backend: backend, mode: mode,
		session:      newMopts(b, m),
		acquired:     newMopts(b, m, AttrOutcome.String(OutcomeAcquired)),
		busy:         newMopts(b, m, AttrOutcome.String(OutcomeBusy)),
		timeout:      newMopts(b, m, AttrOutcome.String(OutcomeTimeout)),
		renewed:      newMopts(b, m, AttrOutcome.String(OutcomeRenewed)),
		heldReleased: newMopts(b, m, AttrOutcome.String(OutcomeReleased)),
		heldLost:     newMopts(b, m, AttrOutcome.String(OutcomeLost)),
	}
	o.tables[k] = t
	return t
}

// measure returns the measurement options for a session: cached unless the
// session has extra attributes or the measurement has an outcome or error
// type not cached (cached.rec == nil).
func (st *sessionCtx) measure(cached mopts, outcome, errType string) mopts {
	if cached.rec != nil && len(st.extra) == 0 {
		return cached
	}
	kvs := make([]attribute.KeyValue, 0, 4+len(st.extra))
	kvs = append(kvs, st.extra...)
	// dislock's own attributes win over extra ones with the same key:
	// attribute.NewSet keeps the last of duplicates.
	kvs = append(kvs, AttrBackend.String(st.tab.backend), AttrMode.String(st.tab.mode))
	if outcome != "" {
		kvs = append(kvs, AttrOutcome.String(outcome))
	}
	if errType != "" {
		kvs = append(kvs, AttrErrorType.String(errType))
	}
	return newMopts(kvs...)
}

func modeOf(m core.Mode, slot bool) string {
	switch {
	case slot:
		return ModeSlot
	case m == core.ModeTry:
		return ModeTry
	case m == core.ModeWait:
		return ModeWait
	}
	return string(m)
}

// keyAttr returns the span attribute for key per WithKey.
func (o *Observer) keyAttr(key string) (attribute.KeyValue, bool) {
	switch o.keyMode {
	case KeyRaw:
		return AttrKey.String(key), true
	case KeyHashed:
		sum := sha256.Sum256([]byte(key))
		return AttrKeySHA256.String(hex.EncodeToString(sum[:])), true
	}
	return attribute.KeyValue{}, false
}

// spanAttrs returns the attributes every dislock span starts with.
func (o *Observer) spanAttrs(backend, mode, key string, token uint64) []attribute.KeyValue {
	kvs := make([]attribute.KeyValue, 0, 4)
	kvs = append(kvs, AttrBackend.String(backend))
	if mode != "" {
		kvs = append(kvs, AttrMode.String(mode))
	}
	if kv, ok := o.keyAttr(key); ok {
		kvs = append(kvs, kv)
	}
	if token != 0 {
		kvs = append(kvs, tokenAttr(token))
	}
	return kvs
}

func tokenAttr(t uint64) attribute.KeyValue {
	if t > 1<<63-1 {
		return AttrToken.String(strconv.FormatUint(t, 10))
	}
	return AttrToken.Int64(int64(t))
}

// fail marks span failed by err: status Error, error.type, and an exception
// event with a sanitized message.
func (o *Observer) fail(span trace.Span, err error, key string) {
	if !span.IsRecording() {
		return
	}
	typ := core.ErrorType(err)
	msg := o.sanitize(err.Error(), key)
	span.SetAttributes(AttrErrorType.String(typ))
	span.AddEvent("exception", trace.WithAttributes(
		attrExceptionType.String(typ), attrExceptionMessage.String(msg)))
	span.SetStatus(codes.Error, msg)
}

// sanitize removes credentials from msg and, unless keys are raw, the key.
func (o *Observer) sanitize(msg, key string) string {
	msg = redact(msg)
	if o.keyMode != KeyRaw && key != "" {
		msg = strings.ReplaceAll(msg, strconv.Quote(key), `"<key>"`)
		msg = strings.ReplaceAll(msg, key, "<key>")
	}
	return msg
}

// isTimeout reports whether err is an acquisition that ended with its ctx.
func isTimeout(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// AcquireStart implements core.Observer: it starts the dislock.acquire span
// as a child of ctx's span.
func (o *Observer) AcquireStart(ctx context.Context, e core.AcquireStartEvent) context.Context {
	mode := modeOf(e.Mode, e.Slot)
	ctx, span := o.tracer.Start(ctx, SpanAcquire, trace.WithAttributes(o.spanAttrs(e.Backend, mode, e.Key, 0)...))
	st := &sessionCtx{Context: ctx, span: span, tab: o.table(e.Backend, mode)}
	if o.attrsFn != nil {
		st.extra = o.attrsFn(e.Key)
	}
	return st
}

// AcquireEnd implements core.Observer: it ends the acquire span and records
// dislock.acquire.duration; an acquired session joins
// dislock.sessions.active.
func (o *Observer) AcquireEnd(ctx context.Context, e core.AcquireEndEvent) {
	st := sessionFrom(ctx)
	if st == nil { // AcquireStart did not run on this context's chain
		st = &sessionCtx{Context: ctx, span: trace.SpanFromContext(context.Background()), tab: o.table(e.Backend, modeOf(e.Mode, e.Slot))}
		if o.attrsFn != nil {
			st.extra = o.attrsFn(e.Key)
		}
	}
	var (
		outcome string
		cached  mopts
		errType string
	)
	switch {
	case e.Err == nil:
		outcome, cached = OutcomeAcquired, st.tab.acquired
	case errors.Is(e.Err, core.ErrNotAcquired) && isTimeout(e.Err):
		outcome, cached = OutcomeTimeout, st.tab.timeout
	case errors.Is(e.Err, core.ErrNotAcquired):
		outcome, cached = OutcomeBusy, st.tab.busy
	default:
		outcome, errType = OutcomeError, core.ErrorType(e.Err)
	}
	span := st.span
	if span.IsRecording() {
		span.SetAttributes(
			AttrOutcome.String(outcome),
			AttrAttempts.Int(e.Attempts),
			AttrWaitSeconds.Float64(e.Wait.Seconds()),
		)
		if e.Session != nil && e.Session.Token() != 0 {
			span.SetAttributes(tokenAttr(e.Session.Token()))
		}
		if outcome == OutcomeError {
			o.fail(span, e.Err, e.Key)
		}
	}
	span.End()
	o.acquireDur.Record(ctx, e.Wait.Seconds(), st.measure(cached, outcome, errType).rec...)
	if e.Err == nil && e.Session != nil && st.active.CompareAndSwap(false, true) {
		o.active.Add(ctx, 1, st.measure(st.tab.session, "", "").add...)
	}
}

// endSession takes a session out of dislock.sessions.active and records
// dislock.held.duration, once per session.
func (o *Observer) endSession(ctx context.Context, st *sessionCtx, held time.Duration, lost bool) {
	if st == nil || !st.active.CompareAndSwap(true, false) {
		return
	}
	o.active.Add(ctx, -1, st.measure(st.tab.session, "", "").add...)
	if lost {
		o.heldDur.Record(ctx, held.Seconds(), st.measure(st.tab.heldLost, OutcomeLost, "").rec...)
	} else {
		o.heldDur.Record(ctx, held.Seconds(), st.measure(st.tab.heldReleased, OutcomeReleased, "").rec...)
	}
}

// startOp returns the context of a renewal or release: it keeps the
// session's state and the start time so the End hook needs no lookups
// through the engine's contexts.
func startOp(ctx context.Context) *opCtx {
	return &opCtx{Context: ctx, st: sessionFrom(ctx), start: time.Now()}
}

// mode is the session's dislock.mode, "" when unknown.
func (op *opCtx) mode() string {
	if op.st != nil {
		return op.st.tab.mode
	}
	return ""
}

// RenewStart implements core.Observer. With WithRenewSpans(true) it starts a
// dislock.renew span as a child of the session's acquire span.
func (o *Observer) RenewStart(ctx context.Context, e core.RenewStartEvent) context.Context {
	op := startOp(ctx)
	if o.renewSpans {
		op.Context, op.span = o.tracer.Start(ctx, SpanRenew,
			trace.WithAttributes(o.spanAttrs(e.Backend, op.mode(), e.Key, e.Token)...))
	}
	return op
}

// RenewEnd implements core.Observer: it records dislock.renew.duration and
// ends the renew span. A failed renewal gets a span (backdated to the
// renewal's start) even without WithRenewSpans.
func (o *Observer) RenewEnd(ctx context.Context, e core.RenewEndEvent) {
	now := time.Now()
	op := opFrom(ctx)
	if op == nil { // RenewStart did not run on this context's chain
		op = &opCtx{Context: ctx, st: sessionFrom(ctx), start: now}
	}
	var outcome, errType string
	switch {
	case e.Err == nil:
		outcome = OutcomeRenewed
	case errors.Is(e.Err, core.ErrLeaseLost):
		outcome, errType = OutcomeLost, core.ErrorType(e.Err)
	default:
		outcome, errType = OutcomeError, core.ErrorType(e.Err)
	}
	span := op.span
	if span == nil && e.Err != nil {
		_, span = o.tracer.Start(ctx, SpanRenew, trace.WithTimestamp(op.start),
			trace.WithAttributes(o.spanAttrs(e.Backend, op.mode(), e.Key, e.Token)...))
	}
	if span != nil {
		if span.IsRecording() {
			span.SetAttributes(AttrOutcome.String(outcome))
			if e.Err != nil {
				o.fail(span, e.Err, e.Key)
			}
		}
		span.End(trace.WithTimestamp(now))
	}
	st := op.st
	if st == nil {
		st = &sessionCtx{tab: o.table(e.Backend, "")}
	}
	var cached mopts
	if outcome == OutcomeRenewed {
		cached = st.tab.renewed
	}
	o.renewDur.Record(ctx, now.Sub(op.start).Seconds(), st.measure(cached, outcome, errType).rec...)
}

// ReleaseStart implements core.Observer: it starts the dislock.release span
// as a child of the session's acquire span.
func (o *Observer) ReleaseStart(ctx context.Context, e core.ReleaseStartEvent) context.Context {
	op := startOp(ctx)
	op.Context, op.span = o.tracer.Start(ctx, SpanRelease,
		trace.WithAttributes(o.spanAttrs(e.Backend, op.mode(), e.Key, e.Token)...))
	return op
}

// ReleaseEnd implements core.Observer: it ends the release span; the first
// release of a session takes it out of dislock.sessions.active and records
// dislock.held.duration.
func (o *Observer) ReleaseEnd(ctx context.Context, e core.ReleaseEndEvent) {
	op := opFrom(ctx)
	if op == nil { // ReleaseStart did not run on this context's chain
		o.endSession(ctx, sessionFrom(ctx), e.Held, false)
		return
	}
	if span := op.span; span != nil {
		if span.IsRecording() {
			outcome := OutcomeReleased
			switch {
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
		span.End()
	}
	o.endSession(ctx, op.st, e.Held, false)
}

// Lost implements core.Observer: it emits a dislock.lease_lost span, a new
// trace root linked to the session's acquire span, counts
// dislock.leases.lost and ends the session's metrics.
func (o *Observer) Lost(ctx context.Context, e core.LostEvent) {
	st := sessionFrom(ctx)
	mode := ""
	acq := trace.SpanContextFromContext(ctx)
	if st != nil {
		mode = st.tab.mode
		acq = st.span.SpanContext()
	}
	attrs := o.spanAttrs(e.Backend, mode, e.Key, e.Token)
	attrs = append(attrs, AttrHeldSeconds.Float64(e.Held.Seconds()))
	opts := []trace.SpanStartOption{trace.WithNewRoot(), trace.WithAttributes(attrs...)}
	if acq.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: acq}))
	}
	_, span := o.tracer.Start(ctx, SpanLeaseLost, opts...)
	err := e.Err
	if err == nil {
		err = core.ErrLeaseLost
	}
	o.fail(span, err, e.Key)
	span.End()

	if st == nil {
		st = &sessionCtx{tab: o.table(e.Backend, mode)}
	}
	o.lost.Add(ctx, 1, st.measure(st.tab.session, "", "").add...)
	o.endSession(ctx, st, e.Held, true)
}
