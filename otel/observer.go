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
	MetricSessionActive   = "dislock.session.active"
	MetricSessionDuration = "dislock.session.duration"
	MetricRenewDuration   = "dislock.renew.duration"
	MetricLeaseLost       = "dislock.lease.lost"
)

// Attribute keys.
const (
	AttrBackend         = attribute.Key("dislock.backend")
	AttrMode            = attribute.Key("dislock.mode")
	AttrSlot            = attribute.Key("dislock.slot")
	AttrOutcome         = attribute.Key("dislock.outcome")
	AttrKey             = attribute.Key("dislock.key")
	AttrKeySHA256       = attribute.Key("dislock.key.sha256")
	AttrToken           = attribute.Key("dislock.token")
	AttrAttempts        = attribute.Key("dislock.attempts")
	AttrWake            = attribute.Key("dislock.wake")
	AttrHolderOwner     = attribute.Key("dislock.holder.owner")
	AttrHolderToken     = attribute.Key("dislock.holder.token")
	AttrHolderRemaining = attribute.Key("dislock.holder.remaining_seconds")
	AttrHeldSeconds     = attribute.Key("dislock.held_seconds")
	AttrLostReason      = attribute.Key("dislock.lost.reason")
	AttrRenewSessions   = attribute.Key("dislock.renew.sessions")
	AttrRenewLost       = attribute.Key("dislock.renew.lost")
	AttrErrorType       = attribute.Key("error.type")
)

// Values of dislock.mode. A slot acquisition (ForSlot) has one of them
// too, and dislock.slot true.
const (
	ModeTry  = "try"  // TryAcquire
	ModeWait = "wait" // Acquire
)

// Values of dislock.outcome.
const (
	OutcomeAcquired = "acquired" // acquire
	OutcomeBusy     = "busy"     // acquire: held elsewhere (TryAcquire)
	OutcomeTimeout  = "timeout"  // acquire: ctx ended while waiting (Acquire)
	OutcomeError    = "error"    // acquire, renew, release: a failure
	OutcomeRenewed  = "renewed"  // renew
	OutcomeLost     = "lost"     // renew: a lease refused by the store; release: the store no longer had the lease; session.duration: lease lost
	OutcomeReleased = "released" // release: freed; session.duration: ended by Release or Close
	OutcomeKept     = "kept"     // release: left to expire (MinHold, slot)
)

// Values of dislock.wake: what woke a waiting Acquire for its last attempt.
const (
	WakeNotification = "notification" // a release notification
	WakePoll         = "poll"         // the polling timer
)

// Values of dislock.lost.reason.
const (
	LostRefused  = "refused"  // the store refused a renewal: another owner holds the key, or it is gone
	LostDeadline = "deadline" // the renew deadline (or the slot's end) passed without a renewal
)

// Bucket boundaries, in seconds.
var (
	// latencyBuckets cover a round trip to a slow one: 100µs to 30s.
	latencyBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
		0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
	// acquireBuckets cover a round trip to a long wait: 100µs to 1h.
	acquireBuckets = append(append([]float64(nil), latencyBuckets...), 60, 120, 300, 600, 1800, 3600)
	// heldBuckets cover a quick job to a day-long one: 10ms to 24h.
	heldBuckets = []float64{0.01, 0.1, 1, 5, 10, 30, 60, 300, 600, 1800, 3600,
		7200, 21600, 86400}
)

// Observer implements core.Observer, and core.RenewBatchObserver, with
// OpenTelemetry spans and metrics. Install it with core.WithObserver. It is
// safe for concurrent use, and keeps its state apart from any other
// Observer's, so several (of this package or others) compose.
type Observer struct {
	tracer     trace.Tracer
	keyMode    KeyMode
	renewSpans bool
	attrs      []attribute.KeyValue // WithAttributes
	attrsFn    func(string) []attribute.KeyValue

	acquireDur metric.Float64Histogram
	heldDur    metric.Float64Histogram
	renewDur   metric.Float64Histogram
	active     metric.Int64UpDownCounter
	lost       metric.Int64Counter

	mu     sync.RWMutex
	tables map[tableKey]*attrTable
}

var _ core.RenewBatchObserver = (*Observer)(nil)

// New returns an Observer. Without WithTracerProvider and
// WithMeterProvider it uses the global providers.
func New(opts ...Option) (*Observer, error) {
	cfg := config{renewSpans: true}
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if cfg.keyMode < KeyRaw || cfg.keyMode > KeyOmitted {
		return nil, errors.New("dislock/otel: " + cfg.keyOpt + ": unknown KeyMode " + strconv.Itoa(int(cfg.keyMode)))
	}
	for _, kv := range cfg.attrs {
		if !kv.Valid() {
			return nil, errors.New("dislock/otel: WithAttributes: invalid attribute " + strconv.Quote(string(kv.Key)))
		}
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
		attrs:      cfg.attrs,
		attrsFn:    cfg.attrsFn,
		tables:     make(map[tableKey]*attrTable),
	}
	m := cfg.mp.Meter(ScopeName, metric.WithInstrumentationVersion(Version))
	var err, e error
	o.acquireDur, e = m.Float64Histogram(MetricAcquireDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of lock acquisitions, including waiting."),
		metric.WithExplicitBucketBoundaries(acquireBuckets...))
	err = errors.Join(err, e)
	o.heldDur, e = m.Float64Histogram(MetricSessionDuration, metric.WithUnit("s"),
		metric.WithDescription("How long sessions held their lock, from acquisition to release or loss."),
		metric.WithExplicitBucketBoundaries(heldBuckets...))
	err = errors.Join(err, e)
	o.renewDur, e = m.Float64Histogram(MetricRenewDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of renewal calls, each renewing one or more sessions."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	err = errors.Join(err, e)
	o.active, e = m.Int64UpDownCounter(MetricSessionActive, metric.WithUnit("{session}"),
		metric.WithDescription("Sessions currently held by this process."))
	err = errors.Join(err, e)
	o.lost, e = m.Int64Counter(MetricLeaseLost, metric.WithUnit("{lease}"),
		metric.WithDescription("Leases lost: refused by the store or not renewed in time."))
	err = errors.Join(err, e)
	if err != nil {
		return nil, err
	}
	return o, nil
}

// BackendName returns the dislock.backend value for a backend's Name: the
// OpenTelemetry db.system.name value where there is one ("pg" becomes
// "postgresql"), else the name itself ("redis", "etcd", "zookeeper",
// "memory").
func BackendName(name string) string {
	switch name {
	case "pg", "postgres":
		return "postgresql"
	}
	return name
}

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

// Metric attribute sets, built once per (backend, mode, slot).

type tableKey struct {
	backend, mode string
	slot          bool
}

type mopts struct {
	rec []metric.RecordOption
	add []metric.AddOption
}

func newMopts(kvs ...attribute.KeyValue) mopts {
	o := metric.WithAttributeSet(attribute.NewSet(kvs...))
	return mopts{rec: []metric.RecordOption{o}, add: []metric.AddOption{o}}
}

type attrTable struct {
	base         []attribute.KeyValue // static attributes, then backend, mode, slot
	mode         string
	slot         bool
	session      mopts
	acquired     mopts
	busy         mopts
	timeout      mopts
	renewed      mopts
	heldReleased mopts
	heldLost     mopts
	lostRefused  mopts
	lostDeadline mopts
}

// table returns the cached attribute sets for sessions of backend, mode
// and slot; mode "" is for renewal calls, which serve many sessions.
func (o *Observer) table(backend, mode string, slot bool) *attrTable {
	k := tableKey{backend, mode, slot}
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
	// dislock's own attributes come last: attribute.NewSet keeps the last
	// of duplicates, so static ones cannot override them.
	base := append([]attribute.KeyValue(nil), o.attrs...)
	base = append(base, AttrBackend.String(BackendName(backend)))
	if mode != "" {
		base = append(base, AttrMode.String(mode), AttrSlot.Bool(slot))
	}
	with := func(kvs ...attribute.KeyValue) mopts {
		return newMopts(append(append([]attribute.KeyValue(nil), base...), kvs...)...)
	}
	t = &attrTable{
		base: base, mode: mode, slot: slot,
		session:      with(),
		acquired:     with(AttrOutcome.String(OutcomeAcquired)),
		busy:         with(AttrOutcome.String(OutcomeBusy)),
		timeout:      with(AttrOutcome.String(OutcomeTimeout)),
		renewed:      with(AttrOutcome.String(OutcomeRenewed)),
		heldReleased: with(AttrOutcome.String(OutcomeReleased)),
		heldLost:     with(AttrOutcome.String(OutcomeLost)),
		lostRefused:  with(AttrLostReason.String(LostRefused)),
		lostDeadline: with(AttrLostReason.String(LostDeadline)),
	}
	o.tables[k] = t
	return t
}

// measure returns the measurement options: cached unless extra attributes
// are given or cached is empty (an outcome or error type not cached), in
// which case the set is built from the table, extra and kvs.
func (t *attrTable) measure(cached mopts, extra []attribute.KeyValue, kvs ...attribute.KeyValue) mopts {
	if cached.rec != nil && len(extra) == 0 {
		return cached
	}
	all := make([]attribute.KeyValue, 0, len(extra)+len(t.base)+len(kvs))
	all = append(all, extra...)
	all = append(all, t.base...)
	all = append(all, kvs...)
	return newMopts(all...)
}

func modeOf(m core.Mode) string {
	switch m {
	case core.ModeTry:
		return ModeTry
	case core.ModeWait:
		return ModeWait
	}
	return string(m)
}

// keyAttr returns the span attribute for key per WithKeyMode.
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

// spanAttrs returns the attributes a session's spans start with; st may
// be nil when the session's mode is unknown.
func (o *Observer) spanAttrs(backend string, st *sessionCtx, key string, token uint64, more int) []attribute.KeyValue {
	kvs := make([]attribute.KeyValue, 0, len(o.attrs)+5+more)
	kvs = append(kvs, o.attrs...)
	kvs = append(kvs, AttrBackend.String(BackendName(backend)))
	if st != nil {
		kvs = append(kvs, AttrMode.String(st.tab.mode), AttrSlot.Bool(st.tab.slot))
	}
	if kv, ok := o.keyAttr(key); ok {
		kvs = append(kvs, kv)
	}
	if token != 0 {
		kvs = append(kvs, AttrToken.String(tokenString(token)))
	}
	return kvs
}

func tokenString(t uint64) string { return strconv.FormatUint(t, 10) }

// fail marks span failed by err: error.type and status Error with a
// sanitized message.
func (o *Observer) fail(span trace.Span, err error, key string) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(AttrErrorType.String(core.ErrorType(err)))
	span.SetStatus(codes.Error, o.sanitize(err.Error(), key))
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
