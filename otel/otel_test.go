package otel_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/locktest"
	"github.com/dislock/dislock/core/memlock"
	"github.com/dislock/dislock/internal/testenv"
	dlotel "github.com/dislock/dislock/otel"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture is an Observer wired to an in-memory span recorder and a manual
// metric reader, passed by option (never the globals).
type fixture struct {
	obs    *dlotel.Observer
	sr     *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	store  *memlock.Store
}

func newFixture(t *testing.T, opts ...dlotel.Option) *fixture {
	t.Helper()
	f := &fixture{sr: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader(), store: memlock.NewStore()}
	f.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(f.sr))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(f.reader))
	t.Cleanup(func() {
		_ = f.tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	obs, err := dlotel.New(append([]dlotel.Option{dlotel.WithTracerProvider(f.tp), dlotel.WithMeterProvider(mp)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	f.obs = obs
	return f
}

// locker returns a Locker on the fixture's store with the observer.
func (f *fixture) locker(t *testing.T, opts ...core.Option) *core.Client {
	t.Helper()
	return f.lockerOn(t, f.store.Backend(), opts...)
}

func (f *fixture) lockerOn(t *testing.T, b core.Backend, opts ...core.Option) *core.Client {
	t.Helper()
	return testenv.Client(t, b, core.WithObserver(f.obs), core.WithDefaults(opts...))
}

func (f *fixture) spans(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range f.sr.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func (f *fixture) span(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	list := f.spans(name)
	if len(list) != 1 {
		t.Fatalf("%d %s spans, want 1", len(list), name)
	}
	return list[0]
}

func (f *fixture) collect(t *testing.T) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := f.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	return rm
}

// eventually polls cond until it holds or 5s pass. Hooks that run after
// Session.Done closes (Lost) or on the renewer goroutine (RenewEnd) need it.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !testenv.WaitFor(5*time.Second, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := make(map[attribute.Key]attribute.Value)
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// wantAttrs checks the span has these attributes (values compared as
// emitted) and none of the absent keys.
func wantAttrs(t *testing.T, s sdktrace.ReadOnlySpan, want map[attribute.Key]any, absent ...attribute.Key) {
	t.Helper()
	got := attrs(s)
	for k, v := range want {
		g, ok := got[k]
		if !ok {
			t.Errorf("%s: no attribute %s (have %v)", s.Name(), k, s.Attributes())
			continue
		}
		if fmt.Sprint(g.AsInterface()) != fmt.Sprint(v) {
			t.Errorf("%s: %s = %v, want %v", s.Name(), k, g.AsInterface(), v)
		}
	}
	for _, k := range absent {
		if v, ok := got[k]; ok {
			t.Errorf("%s: unexpected attribute %s = %v", s.Name(), k, v.AsInterface())
		}
	}
}

func hasEvent(s sdktrace.ReadOnlySpan, name string) bool {
	for _, e := range s.Events() {
		if e.Name == name {
			return true
		}
	}
	return false
}

// unended lists the spans started and never ended.
func (f *fixture) unended() []string {
	ended := map[trace.SpanID]bool{}
	for _, s := range f.sr.Ended() {
		ended[s.SpanContext().SpanID()] = true
	}
	var out []string
	for _, s := range f.sr.Started() {
		if !ended[s.SpanContext().SpanID()] {
			out = append(out, s.Name())
		}
	}
	return out
}

func linked(s sdktrace.ReadOnlySpan, to trace.SpanContext) bool {
	for _, l := range s.Links() {
		if l.SpanContext.Equal(to) {
			return true
		}
	}
	return false
}

func isChild(child, parent sdktrace.ReadOnlySpan) bool {
	return child.Parent().SpanID() == parent.SpanContext().SpanID() &&
		child.SpanContext().TraceID() == parent.SpanContext().TraceID()
}

// noExceptionEvents checks that no span carries an exception event.
func noExceptionEvents(t *testing.T, f *fixture) {
	t.Helper()
	for _, s := range f.sr.Ended() {
		if hasEvent(s, "exception") {
			t.Errorf("%s has an exception event", s.Name())
		}
	}
}

func TestAcquireAndRelease(t *testing.T) {
	f := newFixture(t)
	l := f.locker(t)
	tr := f.tp.Tracer("test")
	ctx, parent := tr.Start(context.Background(), "job")
	s := testenv.Hold(t, ctx, l, "reports")
	acq := f.span(t, dlotel.SpanAcquire)
	if acq.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Errorf("acquire span's parent is %v, want the caller's span", acq.Parent().SpanID())
	}
	if acq.SpanKind() != trace.SpanKindInternal {
		t.Errorf("acquire span kind %v", acq.SpanKind())
	}
	if acq.Status().Code != codes.Unset {
		t.Errorf("acquire status %v", acq.Status())
	}
	wantAttrs(t, acq, map[attribute.Key]any{
		dlotel.AttrBackend: "memory", dlotel.AttrMode: "try", dlotel.AttrSlot: false, dlotel.AttrOutcome: "acquired",
		dlotel.AttrAttempts: 1, dlotel.AttrKey: "reports", dlotel.AttrToken: fmt.Sprint(s.Token()),
	}, dlotel.AttrErrorType, "dislock.wait_seconds", dlotel.AttrWake, dlotel.AttrHolderOwner)
	if v := attrs(acq)[dlotel.AttrToken]; v.Type() != attribute.STRING {
		t.Errorf("dislock.token is a %v, want a string", v.Type())
	}
	if is := acq.InstrumentationScope(); is.Name != dlotel.ScopeName || is.Version != dlotel.Version {
		t.Errorf("scope %+v", is)
	}

	rctx, rel0 := tr.Start(ctx, "cleanup")
	if err := s.Release(rctx); err != nil {
		t.Fatal(err)
	}
	rel0.End()
	parent.End()
	rel := f.span(t, dlotel.SpanRelease)
	if rel.Parent().SpanID() != rel0.SpanContext().SpanID() {
		t.Errorf("release span's parent is %v, want the span in Release's ctx", rel.Parent().SpanID())
	}
	if !linked(rel, acq.SpanContext()) {
		t.Errorf("release span links %v, want the acquire span", rel.Links())
	}
	wantAttrs(t, rel, map[attribute.Key]any{
		dlotel.AttrBackend: "memory", dlotel.AttrMode: "try", dlotel.AttrOutcome: "released",
		dlotel.AttrKey: "reports", dlotel.AttrToken: fmt.Sprint(s.Token()),
	})
	if _, ok := attrs(rel)[dlotel.AttrHeldSeconds]; !ok {
		t.Error("release span has no held time")
	}
	if rel.Status().Code != codes.Unset {
		t.Errorf("release status %v", rel.Status())
	}
	// A second Release does nothing and emits nothing.
	_ = s.Release(context.Background())
	if n := len(f.spans(dlotel.SpanRelease)); n != 1 {
		t.Errorf("%d release spans after a repeated Release, want 1", n)
	}
	if u := f.unended(); len(u) != 0 {
		t.Errorf("spans never ended: %v", u)
	}
}

// tracingBackend traces its own store calls from the ctx it is given, as a
// traced database driver (otelpgx, redisotel) does.
type tracingBackend struct {
	*memlock.Backend
	tr trace.Tracer
}

func (b *tracingBackend) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	ctx, span := b.tr.Start(ctx, "driver.acquire")
	defer span.End()
	return b.Backend.TryAcquire(ctx, req)
}

func (b *tracingBackend) Renew(ctx context.Context, reqs []core.RenewRequest) ([]error, error) {
	ctx, span := b.tr.Start(ctx, "driver.renew")
	defer span.End()
	return b.Backend.Renew(ctx, reqs)
}

func (b *tracingBackend) Release(ctx context.Context, req core.ReleaseRequest) error {
	ctx, span := b.tr.Start(ctx, "driver.release")
	defer span.End()
	return b.Backend.Release(ctx, req)
}

func (f *fixture) tracingBackend() *tracingBackend {
	return &tracingBackend{Backend: f.store.Backend(), tr: f.tp.Tracer("driver")}
}

// A session acquired in one request and released from another: the
// release belongs to the releasing request's trace, with the driver's
// release span, and links back to the acquisition.
func TestReleaseFollowsTheCaller(t *testing.T) {
	f := newFixture(t)
	l := f.lockerOn(t, f.tracingBackend())
	tr := f.tp.Tracer("test")
	actx, reqA := tr.Start(context.Background(), "request A")
	s := testenv.Hold(t, actx, l, "k")
	reqA.End()
	bctx, reqB := tr.Start(context.Background(), "request B")
	if err := s.Release(bctx); err != nil {
		t.Fatal(err)
	}
	reqB.End()
	acq, rel := f.span(t, dlotel.SpanAcquire), f.span(t, dlotel.SpanRelease)
	if rel.SpanContext().TraceID() != reqB.SpanContext().TraceID() || rel.Parent().SpanID() != reqB.SpanContext().SpanID() {
		t.Errorf("release span is not a child of the releasing request's span")
	}
	if !linked(rel, acq.SpanContext()) {
		t.Errorf("release span is not linked to the acquire span")
	}
	if d := f.span(t, "driver.release"); d.SpanContext().TraceID() != reqB.SpanContext().TraceID() {
		t.Errorf("the driver's release span is in another trace than the release span")
	}
	if d := f.span(t, "driver.acquire"); !isChild(d, acq) {
		t.Errorf("the driver's acquire span is not a child of dislock.acquire")
	}

	// Close releases with no caller: a new root linked to the acquisition.
	testenv.Hold(t, actx, l, "k2")
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	rels := f.spans(dlotel.SpanRelease)
	if len(rels) != 2 {
		t.Fatalf("%d release spans, want 2", len(rels))
	}
	acqs := f.spans(dlotel.SpanAcquire)
	if r := rels[1]; r.Parent().IsValid() || !linked(r, acqs[1].SpanContext()) {
		t.Errorf("release by Close: parent %v links %v, want a root linked to the acquisition", r.Parent(), r.Links())
	}
}

// heldElsewhere holds key "k" as owner worker-7 on one of the fixture's
// Lockers until the test ends, and returns the session and another Locker.
func (f *fixture) heldElsewhere(t *testing.T) (core.Session, *core.Client) {
	t.Helper()
	s := testenv.Hold(t, context.Background(), f.locker(t), "k", core.WithOwner("worker-7"))
	t.Cleanup(func() { s.Release(context.Background()) })
	return s, f.locker(t)
}

func TestBusyIsAnOutcomeNotAnError(t *testing.T) {
	f := newFixture(t)
	s, b := f.heldElsewhere(t)
	if _, err := b.TryAcquire(context.Background(), "k"); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("second TryAcquire: %v", err)
	}
	spans := f.spans(dlotel.SpanAcquire)
	if len(spans) != 2 {
		t.Fatalf("%d acquire spans", len(spans))
	}
	busy := spans[1]
	wantAttrs(t, busy, map[attribute.Key]any{dlotel.AttrOutcome: "busy", dlotel.AttrMode: "try", dlotel.AttrAttempts: 1,
		dlotel.AttrHolderOwner: "worker-7", dlotel.AttrHolderToken: fmt.Sprint(s.Token())},
		dlotel.AttrToken, dlotel.AttrErrorType, dlotel.AttrWake)
	if r := attrs(busy)[dlotel.AttrHolderRemaining].AsFloat64(); r <= 0 || r > 30 {
		t.Errorf("holder remaining %vs, want within the 30s TTL", r)
	}
	if busy.Status().Code != codes.Unset {
		t.Errorf("busy acquire has status %v; contention is not an error", busy.Status())
	}
	noExceptionEvents(t, f)
}

func TestWaitTimeout(t *testing.T) {
	f := newFixture(t)
	s, b := f.heldElsewhere(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Millisecond)
	defer cancel()
	if _, err := b.Acquire(ctx, "k", core.Backoff(5*time.Millisecond, 10*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire: %v", err)
	}
	sp := f.spans(dlotel.SpanAcquire)[1]
	wantAttrs(t, sp, map[attribute.Key]any{dlotel.AttrOutcome: "timeout", dlotel.AttrMode: "wait",
		dlotel.AttrWake: "poll", dlotel.AttrHolderOwner: "worker-7", dlotel.AttrHolderToken: fmt.Sprint(s.Token())},
		dlotel.AttrErrorType, "dislock.wait_seconds")
	if sp.Status().Code != codes.Unset {
		t.Errorf("timeout status %v", sp.Status())
	}
	if n := attrs(sp)[dlotel.AttrAttempts].AsInt64(); n < 2 {
		t.Errorf("attempts %d, want several", n)
	}
	if d := sp.EndTime().Sub(sp.StartTime()); d < 50*time.Millisecond {
		t.Errorf("span lasts %v, want the wait (≥ 50ms)", d)
	}
}

// An outage is an error, never busy or timeout: a TryAcquire whose store
// does not answer by the deadline, and a wait on a store that fails,
// end with outcome error and an error.type that says why.
func TestOutageIsAnError(t *testing.T) {
	f := newFixture(t)
	a := f.locker(t)
	slow := f.store.Backend()
	b := f.lockerOn(t, slow)
	s := testenv.Hold(t, context.Background(), a, "k")
	defer s.Release(context.Background())
	slow.SetLatency(300 * time.Millisecond) // the undo of the claim cut short is as slow
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := b.TryAcquire(ctx, "k"); err == nil || errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("TryAcquire on a slow store: %v", err)
	}
	slow.SetLatency(0)
	slow.SetDown(true)
	ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := b.Acquire(ctx, "k", core.Backoff(5*time.Millisecond, 10*time.Millisecond)); err == nil || errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("Acquire on a down store: %v", err)
	}
	slow.SetDown(false)
	spans := f.spans(dlotel.SpanAcquire)
	if len(spans) != 3 {
		t.Fatalf("%d acquire spans, want 3", len(spans))
	}
	for i, mode := range []string{"try", "wait"} {
		sp := spans[i+1]
		wantAttrs(t, sp, map[attribute.Key]any{dlotel.AttrOutcome: "error", dlotel.AttrMode: mode, dlotel.AttrErrorType: "deadline_exceeded"})
		if sp.Status().Code != codes.Error {
			t.Errorf("%s acquire on a failing store has status %v, want Error", mode, sp.Status())
		}
	}
	rm := f.collect(t)
	if n := tally(rm, dlotel.MetricAcquireDuration, map[attribute.Key]string{dlotel.AttrOutcome: "error", dlotel.AttrErrorType: "deadline_exceeded"}); n != 2 {
		t.Errorf("acquire.duration{error, deadline_exceeded} count %d, want 2", n)
	}
}

// A wait that ends by a release notification, and one that ends by polling
// (a backend without notifications), say so.
func TestWaitWake(t *testing.T) {
	for _, c := range []struct {
		name    string
		watch   bool
		backoff time.Duration // long enough, with notifications, that only one can wake the wait
		want    string
	}{{"notification", true, 10 * time.Second, dlotel.WakeNotification}, {"poll", false, 20 * time.Millisecond, dlotel.WakePoll}} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			var b core.Backend = f.store.Backend()
			if !c.watch {
				b = struct{ core.Backend }{b} // hides Watch
			}
			holder, waiter := f.lockerOn(t, b), f.lockerOn(t, b)
			ctx := context.Background()
			h := testenv.Hold(t, ctx, holder, "k", core.WithOwner("worker-7"))
			s := testenv.AcquireReleased(t, ctx, waiter, h, 30*time.Millisecond, 10*time.Second, core.Backoff(c.backoff, c.backoff))
			defer s.Release(ctx)
			sp := f.spans(dlotel.SpanAcquire)[1]
			wantAttrs(t, sp, map[attribute.Key]any{dlotel.AttrOutcome: "acquired", dlotel.AttrMode: "wait",
				dlotel.AttrWake: c.want, dlotel.AttrHolderOwner: "worker-7", dlotel.AttrHolderToken: fmt.Sprint(h.Token())})
		})
	}
}

func TestSlotMode(t *testing.T) {
	f := newFixture(t)
	l := f.locker(t)
	ctx := context.Background()
	s := testenv.Hold(t, ctx, l, "tick", core.ForSlot(core.Every(time.Hour)))
	if err := s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := l.Acquire(ctx, "tock", core.ForSlot(core.Every(time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	s.Release(ctx)
	acqs, rels := f.spans(dlotel.SpanAcquire), f.spans(dlotel.SpanRelease)
	wantAttrs(t, acqs[0], map[attribute.Key]any{dlotel.AttrMode: "try", dlotel.AttrSlot: true})
	wantAttrs(t, acqs[1], map[attribute.Key]any{dlotel.AttrMode: "wait", dlotel.AttrSlot: true})
	wantAttrs(t, rels[0], map[attribute.Key]any{dlotel.AttrMode: "try", dlotel.AttrSlot: true, dlotel.AttrOutcome: "kept"})
	if n := tally(f.collect(t), dlotel.MetricAcquireDuration, map[attribute.Key]string{
		dlotel.AttrMode: "wait", dlotel.AttrSlot: "true", dlotel.AttrOutcome: "acquired"}); n != 1 {
		t.Errorf("acquire.duration{wait, slot} count %d, want 1", n)
	}
}

// Renewals run in the background: each renewal call is one span, the root
// of its own trace, linked to the sessions it renews, and the parent of the
// driver's spans for the call — no driver span is left without a parent.
func TestRenewSpans(t *testing.T) {
	f := newFixture(t)
	l := f.lockerOn(t, f.tracingBackend(), core.TTL(150*time.Millisecond))
	const n = 20
	var sessions []core.Session
	for i := range n {
		s := testenv.Hold(t, context.Background(), l, fmt.Sprintf("k%d", i))
		sessions = append(sessions, s)
	}
	eventually(t, "two renew spans", func() bool { return len(f.spans(dlotel.SpanRenew)) >= 2 })
	rctx, stop := f.tp.Tracer("test").Start(context.Background(), "shutdown")
	for _, s := range sessions {
		s.Release(rctx)
	}
	stop.End()
	acqs := f.spans(dlotel.SpanAcquire)
	links := 0
	for _, r := range f.spans(dlotel.SpanRenew) {
		if r.Parent().IsValid() {
			t.Errorf("renew span has a parent %v, want a new root", r.Parent())
		}
		wantAttrs(t, r, map[attribute.Key]any{dlotel.AttrOutcome: "renewed", dlotel.AttrBackend: "memory"},
			dlotel.AttrKey, dlotel.AttrErrorType)
		if got := attrs(r)[dlotel.AttrRenewSessions].AsInt64(); got != int64(len(r.Links())) {
			t.Errorf("renew span: %d sessions, %d links", got, len(r.Links()))
		}
		if r.Status().Code != codes.Unset {
			t.Errorf("renew status %v", r.Status())
		}
		for _, ln := range r.Links() {
			found := false
			for _, a := range acqs {
				found = found || ln.SpanContext.Equal(a.SpanContext())
			}
			if !found {
				t.Errorf("renew link %v is not an acquire span", ln.SpanContext)
			}
			var tok, key bool
			for _, kv := range ln.Attributes {
				tok = tok || kv.Key == dlotel.AttrToken
				key = key || kv.Key == dlotel.AttrKey
			}
			if !tok || !key {
				t.Errorf("renew link attributes %v, want the key and token", ln.Attributes)
			}
			links++
		}
	}
	if links < n {
		t.Errorf("renew spans link %d sessions, want all %d", links, n)
	}
	// Every driver span has a dislock parent; renewals' are the renew spans.
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range f.sr.Ended() {
		byID[s.SpanContext().SpanID()] = s
	}
	renewCalls := 0
	for _, s := range f.sr.Ended() {
		if !strings.HasPrefix(s.Name(), "driver.") {
			continue
		}
		p, ok := byID[s.Parent().SpanID()]
		if !ok {
			t.Errorf("%s has no parent span", s.Name())
			continue
		}
		want := map[string]string{"driver.acquire": dlotel.SpanAcquire, "driver.renew": dlotel.SpanRenew}[s.Name()]
		if want != "" && p.Name() != want {
			t.Errorf("%s's parent is %s, want %s", s.Name(), p.Name(), want)
		}
		if s.Name() == "driver.renew" {
			renewCalls++
		}
	}
	if renewCalls == 0 {
		t.Error("no driver renew span")
	}
	if n := tally(f.collect(t), dlotel.MetricRenewDuration, map[attribute.Key]string{dlotel.AttrOutcome: "renewed"}); n < 2 {
		t.Errorf("renew.duration{renewed} count %d", n)
	}
}

func TestRenewSpansOff(t *testing.T) {
	f := newFixture(t, dlotel.WithRenewSpans(false))
	l := f.locker(t, core.TTL(90*time.Millisecond))
	s := testenv.Hold(t, context.Background(), l, "k")
	eventually(t, "two renewals measured", func() bool {
		return tally(f.collect(t), dlotel.MetricRenewDuration, nil) >= 2
	})
	s.Release(context.Background())
	if n := len(f.spans(dlotel.SpanRenew)); n != 0 {
		t.Errorf("%d renew spans for successful renewals with renew spans off", n)
	}
}

// A renewal call that fails gets an Error span, a root linked to the
// session, also with renew spans off; a lease whose renew deadline passes
// is lost with reason "deadline".
func TestRenewFailureAndDeadline(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprint("spans=", on), func(t *testing.T) {
			f := newFixture(t, dlotel.WithRenewSpans(on))
			fb := &failing{Backend: f.store.Backend()}
			l := f.lockerOn(t, fb, core.TTL(150*time.Millisecond))
			s := f.loseLease(t, l, fb, "k")
			acq := f.span(t, dlotel.SpanAcquire)
			var renews []sdktrace.ReadOnlySpan
			for _, r := range f.spans(dlotel.SpanRenew) {
				if attrs(r)[dlotel.AttrOutcome].Emit() != "renewed" { // one may have run before the failures began
					renews = append(renews, r)
				}
			}
			if len(renews) == 0 {
				t.Fatal("no renew span for the failed renewals")
			}
			for _, r := range renews {
				if r.Parent().IsValid() || !linked(r, acq.SpanContext()) || r.Status().Code != codes.Error {
					t.Errorf("failed renew span: parent %v links %v status %v", r.Parent(), r.Links(), r.Status())
				}
				wantAttrs(t, r, map[attribute.Key]any{dlotel.AttrOutcome: "error", dlotel.AttrErrorType: "backend"})
			}
			lost := f.span(t, dlotel.SpanLeaseLost)
			wantAttrs(t, lost, map[attribute.Key]any{dlotel.AttrLostReason: "deadline", dlotel.AttrErrorType: "lease_lost"})
			if lost.Parent().IsValid() || !linked(lost, acq.SpanContext()) {
				t.Errorf("lease_lost: parent %v links %v", lost.Parent(), lost.Links())
			}
			if n := tally(f.collect(t), dlotel.MetricLeaseLost, map[attribute.Key]string{dlotel.AttrLostReason: "deadline"}); n != 1 {
				t.Errorf("lease.lost{deadline} = %d", n)
			}
			if n := tally(f.collect(t), dlotel.MetricRenewDuration, map[attribute.Key]string{
				dlotel.AttrOutcome: "error", dlotel.AttrErrorType: "backend"}); n == 0 {
				t.Error("failed renewals not measured")
			}
			noExceptionEvents(t, f)
			s.Release(context.Background())
		})
	}
}

func TestLeaseLost(t *testing.T) {
	f := newFixture(t)
	l := f.locker(t, core.TTL(150*time.Millisecond))
	s := testenv.Hold(t, context.Background(), l, "k")
	if !f.store.Steal("k") {
		t.Fatal("Steal: not held")
	}
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("loss not signalled")
	}
	if !errors.Is(s.Err(), core.ErrLeaseLost) {
		t.Fatalf("Err = %v", s.Err())
	}
	// Lost runs right after Done closes.
	eventually(t, "the loss recorded", func() bool {
		return tally(f.collect(t), dlotel.MetricLeaseLost, nil) == 1
	})
	acq := f.span(t, dlotel.SpanAcquire)
	lost := f.span(t, dlotel.SpanLeaseLost)
	if lost.Parent().IsValid() || lost.SpanContext().TraceID() == acq.SpanContext().TraceID() {
		t.Errorf("lease_lost span is not a new root")
	}
	// The refusing renewal call is the last renew span.
	renews := f.spans(dlotel.SpanRenew)
	refusing := renews[len(renews)-1]
	if links := lost.Links(); len(links) != 2 || !links[0].SpanContext.Equal(acq.SpanContext()) || !links[1].SpanContext.Equal(refusing.SpanContext()) {
		t.Errorf("lease_lost links %v, want the acquire span and the refusing renew span", links)
	}
	if lost.Status().Code != codes.Error {
		t.Errorf("lease_lost status %v", lost.Status())
	}
	wantAttrs(t, lost, map[attribute.Key]any{
		dlotel.AttrErrorType: "lease_lost", dlotel.AttrToken: fmt.Sprint(s.Token()), dlotel.AttrKey: "k", dlotel.AttrMode: "try",
		dlotel.AttrLostReason: "refused",
	})
	if _, ok := attrs(lost)[dlotel.AttrHeldSeconds]; !ok {
		t.Error("lease_lost has no held time")
	}
	if refusing.Parent().IsValid() || !linked(refusing, acq.SpanContext()) || refusing.Status().Code != codes.Error {
		t.Errorf("refusing renew span: parent %v status %v", refusing.Parent(), refusing.Status())
	}
	wantAttrs(t, refusing, map[attribute.Key]any{dlotel.AttrOutcome: "lost", dlotel.AttrErrorType: "lease_lost", dlotel.AttrRenewLost: 1})
	noExceptionEvents(t, f)

	rm := f.collect(t)
	if v := tally(rm, dlotel.MetricSessionActive, nil); v != 0 {
		t.Errorf("active sessions %d after the loss", v)
	}
	if n := tally(rm, dlotel.MetricSessionDuration, map[attribute.Key]string{dlotel.AttrOutcome: "lost"}); n != 1 {
		t.Errorf("session.duration{outcome=lost} count %d", n)
	}
	if n := tally(rm, dlotel.MetricLeaseLost, map[attribute.Key]string{dlotel.AttrLostReason: "refused", dlotel.AttrMode: "try"}); n != 1 {
		t.Errorf("lease.lost{refused} = %d", n)
	}
	// The holder's Release after a loss frees the key but no longer counts
	// as a session end.
	s.Release(context.Background())
	if v := tally(f.collect(t), dlotel.MetricSessionActive, nil); v != 0 {
		t.Errorf("active sessions %d after Release of a lost session", v)
	}
	if n := tally(f.collect(t), dlotel.MetricSessionDuration, nil); n != 1 {
		t.Errorf("session.duration count %d after Release of a lost session, want 1", n)
	}
}

// Metric helpers. match lists attributes a data point must have.

func matches(set attribute.Set, match map[attribute.Key]string) bool {
	for k, v := range match {
		got, ok := set.Value(k)
		if !ok || got.Emit() != v {
			return false
		}
	}
	return true
}

func find(rm metricdata.ResourceMetrics, name string) *metricdata.Metrics {
	for _, sm := range rm.ScopeMetrics {
		for i := range sm.Metrics {
			if sm.Metrics[i].Name == name {
				return &sm.Metrics[i]
			}
		}
	}
	return nil
}

// tally adds up the data points of metric name whose attributes match:
// the counts of a histogram, the values of a sum.
func tally(rm metricdata.ResourceMetrics, name string, match map[attribute.Key]string) int64 {
	m := find(rm, name)
	if m == nil {
		return 0
	}
	var n int64
	switch d := m.Data.(type) {
	case metricdata.Histogram[float64]:
		for _, dp := range d.DataPoints {
			if matches(dp.Attributes, match) {
				n += int64(dp.Count)
			}
		}
	case metricdata.Sum[int64]:
		for _, dp := range d.DataPoints {
			if matches(dp.Attributes, match) {
				n += dp.Value
			}
		}
	}
	return n
}

// series counts the data points (time series) of every metric.
func series(rm metricdata.ResourceMetrics) int {
	n := 0
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Histogram[float64]:
				n += len(d.DataPoints)
			case metricdata.Sum[int64]:
				n += len(d.DataPoints)
			}
		}
	}
	return n
}

func TestMetricsAfterScriptedSequence(t *testing.T) {
	f := newFixture(t)
	a, b := f.locker(t), f.locker(t)
	ctx := context.Background()

	sa := testenv.Hold(t, ctx, a, "a")
	if _, err := b.TryAcquire(ctx, "a"); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatal(err)
	}
	sb := testenv.Hold(t, ctx, a, "b")
	rm := f.collect(t)
	if v := tally(rm, dlotel.MetricSessionActive, map[attribute.Key]string{dlotel.AttrBackend: "memory", dlotel.AttrMode: "try"}); v != 2 {
		t.Errorf("active sessions %d with two held, want 2", v)
	}
	sa.Release(ctx)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	_, err := b.Acquire(wctx, "b")
	cancel()
	if !errors.Is(err, core.ErrNotAcquired) {
		t.Fatal(err)
	}
	sb.Release(ctx)
	sb.Release(ctx) // idempotent: counted once

	rm = f.collect(t)
	for _, c := range []struct {
		mode, outcome string
		want          int64
	}{{"try", "acquired", 2}, {"try", "busy", 1}, {"wait", "timeout", 1}, {"wait", "acquired", 0}} {
		got := tally(rm, dlotel.MetricAcquireDuration, map[attribute.Key]string{
			dlotel.AttrBackend: "memory", dlotel.AttrMode: c.mode, dlotel.AttrOutcome: c.outcome})
		if got != c.want {
			t.Errorf("acquire.duration{%s,%s} count = %d, want %d", c.mode, c.outcome, got, c.want)
		}
	}
	if v := tally(rm, dlotel.MetricSessionActive, nil); v != 0 {
		t.Errorf("active sessions %d after releasing all", v)
	}
	if n := tally(rm, dlotel.MetricSessionDuration, map[attribute.Key]string{dlotel.AttrOutcome: "released", dlotel.AttrMode: "try"}); n != 2 {
		t.Errorf("session.duration{released} count %d, want 2", n)
	}
	if m := find(rm, dlotel.MetricLeaseLost); m != nil && tally(rm, dlotel.MetricLeaseLost, nil) != 0 {
		t.Errorf("leases lost without a loss")
	}
	m := find(rm, dlotel.MetricAcquireDuration)
	if m.Unit != "s" {
		t.Errorf("acquire.duration unit %q", m.Unit)
	}
	dp := m.Data.(metricdata.Histogram[float64]).DataPoints[0]
	// Long waits land in buckets of their own, not all in +Inf.
	if b := dp.Bounds; len(b) == 0 || b[0] != 0.0001 || b[len(b)-1] != 3600 {
		t.Errorf("acquire.duration bounds %v, want 0.0001 … 3600", b)
	}
	// No metric has the key.
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != dlotel.ScopeName {
			t.Errorf("meter scope %q", sm.Scope.Name)
		}
		for _, m := range sm.Metrics {
			forEachAttrSet(m, func(s attribute.Set) {
				if _, ok := s.Value(dlotel.AttrKey); ok {
					t.Errorf("%s has the key as an attribute", m.Name)
				}
			})
		}
	}
}

func forEachAttrSet(m metricdata.Metrics, fn func(attribute.Set)) {
	switch d := m.Data.(type) {
	case metricdata.Histogram[float64]:
		for _, dp := range d.DataPoints {
			fn(dp.Attributes)
		}
	case metricdata.Sum[int64]:
		for _, dp := range d.DataPoints {
			fn(dp.Attributes)
		}
	}
}

func TestSeriesDoNotGrowWithKeys(t *testing.T) {
	f := newFixture(t)
	l := f.locker(t)
	ctx := context.Background()
	cycle := func(from, to int) {
		for i := from; i < to; i++ {
			s := testenv.Hold(t, ctx, l, fmt.Sprintf("job-%d", i))
			if err := s.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	cycle(0, 10)
	before := series(f.collect(t))
	cycle(10, 1000)
	after := series(f.collect(t))
	if before == 0 || after != before {
		t.Errorf("metric series: %d after 10 keys, %d after 1000", before, after)
	}
}

func TestMetricAttributesFn(t *testing.T) {
	f := newFixture(t, dlotel.WithMetricAttributesFn(func(key string) []attribute.KeyValue {
		job, _, _ := strings.Cut(key, ":")
		return []attribute.KeyValue{attribute.String("job", job), dlotel.AttrBackend.String("spoofed")}
	}))
	l := f.locker(t)
	for _, k := range []string{"backup:1", "backup:2", "report:1"} {
		s := testenv.Hold(t, context.Background(), l, k)
		s.Release(context.Background())
	}
	rm := f.collect(t)
	if n := tally(rm, dlotel.MetricAcquireDuration, map[attribute.Key]string{"job": "backup", dlotel.AttrBackend: "memory"}); n != 2 {
		t.Errorf("acquire.duration{job=backup} count %d, want 2", n)
	}
	if n := tally(rm, dlotel.MetricSessionDuration, map[attribute.Key]string{"job": "report"}); n != 1 {
		t.Errorf("session.duration{job=report} count %d, want 1", n)
	}
}

func TestKeyModes(t *testing.T) {
	const key = "tenant-SENTINELKEY"
	for _, c := range []struct {
		mode   dlotel.KeyMode
		attr   attribute.Key
		absent []attribute.Key
	}{
		{dlotel.KeyRaw, dlotel.AttrKey, []attribute.Key{dlotel.AttrKeySHA256}},
		{dlotel.KeyHashed, dlotel.AttrKeySHA256, []attribute.Key{dlotel.AttrKey}},
		{dlotel.KeyOmitted, "", []attribute.Key{dlotel.AttrKey, dlotel.AttrKeySHA256}},
	} {
		t.Run(fmt.Sprint(c.mode), func(t *testing.T) {
			f := newFixture(t, dlotel.WithKeyMode(c.mode))
			fb := &failing{Backend: f.store.Backend()}
			l := f.lockerOn(t, fb)
			fb.acquire.Store(true)
			if _, err := l.TryAcquire(context.Background(), key); err == nil {
				t.Fatal("acquire did not fail")
			}
			fb.acquire.Store(false)
			s := testenv.Hold(t, context.Background(), l, key)
			s.Release(context.Background())
			for _, sp := range f.sr.Ended() {
				if c.attr != "" {
					wantAttrs(t, sp, map[attribute.Key]any{}, c.absent...)
					if _, ok := attrs(sp)[c.attr]; !ok {
						t.Errorf("%s has no %s", sp.Name(), c.attr)
					}
				} else {
					wantAttrs(t, sp, nil, c.absent...)
				}
				if c.mode != dlotel.KeyRaw {
					if where := findString(sp, "SENTINELKEY"); where != "" {
						t.Errorf("key appears in %s %s", sp.Name(), where)
					}
				}
			}
		})
	}
	// The deprecated WithKey still works; each names itself when wrong.
	for name, opt := range map[string]func(dlotel.KeyMode) dlotel.Option{"WithKeyMode": dlotel.WithKeyMode, "WithKey": dlotel.WithKey} {
		if _, err := dlotel.New(opt(dlotel.KeyMode(42))); err == nil || !strings.Contains(err.Error(), "otel: "+name+":") {
			t.Errorf("%s(42): %v, want an error naming %s", name, err, name)
		}
		if _, err := dlotel.New(opt(dlotel.KeyHashed)); err != nil {
			t.Errorf("%s(KeyHashed): %v", name, err)
		}
	}
}

// failing wraps a memlock backend and fails the calls switched on with an
// error that embeds a connection string with a password.
type failing struct {
	*memlock.Backend
	acquire, renew, release atomic.Bool
}

var errDial = fmt.Errorf("dial postgres://u:SENTINELPW@h:5432/db?sslmode=disable password=SENTINELPW: refused")

func (b *failing) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	if b.acquire.Load() {
		return core.Lease{}, errDial
	}
	return b.Backend.TryAcquire(ctx, req)
}

func (b *failing) Renew(ctx context.Context, reqs []core.RenewRequest) ([]error, error) {
	if b.renew.Load() {
		return nil, errDial
	}
	return b.Backend.Renew(ctx, reqs)
}

func (b *failing) Release(ctx context.Context, req core.ReleaseRequest) error {
	if b.release.Load() {
		return errDial
	}
	return b.Backend.Release(ctx, req)
}

// loseLease acquires key on l and fails fb's renewals until the session is
// lost and the loss recorded (the fixture's first); renewals then work
// again. It returns the lost session.
func (f *fixture) loseLease(t *testing.T, l *core.Client, fb *failing, key string) core.Session {
	t.Helper()
	s := testenv.Hold(t, context.Background(), l, key)
	fb.renew.Store(true)
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("loss not signalled")
	}
	eventually(t, "the loss recorded", func() bool { return len(f.spans(dlotel.SpanLeaseLost)) == 1 })
	fb.renew.Store(false)
	return s
}

// findString reports where s appears in a span: "" when nowhere.
func findString(sp sdktrace.ReadOnlySpan, s string) string {
	check := func(kvs []attribute.KeyValue) bool {
		for _, kv := range kvs {
			if strings.Contains(string(kv.Key), s) || strings.Contains(kv.Value.Emit(), s) {
				return true
			}
		}
		return false
	}
	switch {
	case strings.Contains(sp.Name(), s):
		return "name"
	case check(sp.Attributes()):
		return "attributes"
	case strings.Contains(sp.Status().Description, s):
		return "status"
	}
	for _, e := range sp.Events() {
		if strings.Contains(e.Name, s) || check(e.Attributes) {
			return "event " + e.Name
		}
	}
	for _, l := range sp.Links() {
		if check(l.Attributes) {
			return "link"
		}
	}
	return ""
}

func TestNoSecretsInTelemetry(t *testing.T) {
	f := newFixture(t, dlotel.WithRenewSpans(true))
	fb := &failing{Backend: f.store.Backend()}
	l := f.lockerOn(t, fb, core.TTL(150*time.Millisecond))
	ctx := context.Background()

	// A failed acquisition.
	fb.acquire.Store(true)
	if _, err := l.TryAcquire(ctx, "k1"); err == nil || !strings.Contains(err.Error(), "SENTINELPW") {
		t.Fatalf("acquire error %v does not carry the backend's message", err)
	}
	fb.acquire.Store(false)
	// A failed release.
	s := testenv.Hold(t, ctx, l, "k2")
	fb.release.Store(true)
	if err := s.Release(ctx); err == nil {
		t.Fatal("release did not fail")
	}
	fb.release.Store(false)
	s.Release(ctx)
	// Failed renewals until the renew deadline passes: a loss.
	f.loseLease(t, l, fb, "k3")

	var failed int
	for _, sp := range f.sr.Ended() {
		if where := findString(sp, "SENTINELPW"); where != "" {
			t.Errorf("the password appears in %s's %s", sp.Name(), where)
		}
		if sp.Status().Code == codes.Error {
			failed++
			if attrs(sp)[dlotel.AttrErrorType].Emit() == "" {
				t.Errorf("%s failed without error.type", sp.Name())
			}
		}
	}
	// acquire, release, ≥1 renew, lease_lost
	if failed < 4 {
		t.Errorf("%d failed spans, want at least 4", failed)
	}
	acq := f.spans(dlotel.SpanAcquire)[0]
	wantAttrs(t, acq, map[attribute.Key]any{dlotel.AttrOutcome: "error", dlotel.AttrErrorType: "backend"})
	if d := acq.Status().Description; !strings.Contains(d, "postgres://REDACTED@h:5432/db") || !strings.Contains(d, "password=REDACTED") {
		t.Errorf("acquire status %q: want the sanitized message", d)
	}
	rm := f.collect(t)
	if n := tally(rm, dlotel.MetricAcquireDuration, map[attribute.Key]string{dlotel.AttrOutcome: "error", dlotel.AttrErrorType: "backend"}); n != 1 {
		t.Errorf("acquire.duration{error, backend} count %d", n)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			forEachAttrSet(m, func(s attribute.Set) {
				for _, kv := range s.ToSlice() {
					if strings.Contains(kv.Value.Emit(), "SENTINELPW") {
						t.Errorf("the password appears in %s's attributes", m.Name)
					}
				}
			})
		}
	}
}

// holdOnce acquires and releases one key on a memlock Locker observed by
// obs.
func holdOnce(t *testing.T, obs core.Observer) {
	t.Helper()
	l, err := memlock.New(core.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	s := testenv.Hold(t, context.Background(), l, "k")
	if err := s.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestDefaultsToGlobalProviders(t *testing.T) {
	obs, err := dlotel.New(dlotel.WithTracerProvider(nil), dlotel.WithMeterProvider(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	holdOnce(t, obs)
}

// TestConformance runs the locktest suite over memlock with the observer
// installed: the observer changes no behaviour.
func TestConformance(t *testing.T) {
	t.Parallel() // its own store and providers; the suites mostly wait on timers
	f := newFixture(t, dlotel.WithRenewSpans(true))
	store := memlock.NewStore()
	const ttl = 600 * time.Millisecond
	locktest.Run(t, locktest.Harness{
		NewBackend:    func(testing.TB) core.Backend { return store.Backend() },
		ClientOptions: []core.ClientOption{core.WithObserver(f.obs)},
		Steal:         func(_ context.Context, key string) error { store.Steal(key); return nil },
		Delete:        func(_ context.Context, key string) error { store.Delete(key); return nil },
		TTL:           ttl,
	})
	if len(f.spans(dlotel.SpanAcquire)) == 0 || len(f.spans(dlotel.SpanLeaseLost)) == 0 {
		t.Error("the suite ran without the observer seeing acquisitions and losses")
	}
}

func TestStdoutExporter(t *testing.T) {
	var buf bytes.Buffer
	exp, err := stdouttrace.New(stdouttrace.WithWriter(&buf))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	obs, err := dlotel.New(dlotel.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	holdOnce(t, obs)
	for _, want := range []string{`"Name":"dislock.acquire"`, `"Name":"dislock.release"`, `"dislock.outcome"`} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("stdout output lacks %s:\n%s", want, buf.String())
		}
	}
}

func TestSessionEndCountedOnce(t *testing.T) {
	f := newFixture(t)
	fb := &failing{Backend: f.store.Backend()}
	l := f.lockerOn(t, fb)
	ctx := context.Background()
	s := testenv.Hold(t, ctx, l, "a")
	if _, err := l.TryAcquire(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	// A failed Release ends the session locally; its retry is another
	// release span but not another end.
	fb.release.Store(true)
	if err := s.Release(ctx); err == nil {
		t.Fatal("release did not fail")
	}
	fb.release.Store(false)
	if err := s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(f.spans(dlotel.SpanRelease)); n != 2 {
		t.Errorf("%d release spans, want 2", n)
	}
	if got := attrs(f.spans(dlotel.SpanRelease)[0])[dlotel.AttrOutcome].Emit(); got != "error" {
		t.Errorf("failed release outcome %q", got)
	}
	// Close releases "b".
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	rm := f.collect(t)
	if v := tally(rm, dlotel.MetricSessionActive, nil); v != 0 {
		t.Errorf("active sessions %d, want 0", v)
	}
	if n := tally(rm, dlotel.MetricSessionDuration, nil); n != 2 {
		t.Errorf("session.duration count %d, want 2 (one per session)", n)
	}
}

// A Release that finds the lease gone from the store (taken over before
// any renewal noticed) is a loss: a dislock.lease_lost span (refused), a
// release span with outcome lost and an error status, and the session
// counted as lost, once.
func TestReleaseFindsLeaseGone(t *testing.T) {
	f := newFixture(t)
	l := f.locker(t, core.TTL(time.Minute))
	s := testenv.Hold(t, context.Background(), l, "k")
	f.store.Steal("k")
	if err := s.Release(context.Background()); !errors.Is(err, core.ErrLeaseLost) {
		t.Fatalf("Release = %v, want ErrLeaseLost", err)
	}
	rel := f.span(t, dlotel.SpanRelease)
	if rel.Status().Code != codes.Error {
		t.Errorf("release status %v", rel.Status())
	}
	wantAttrs(t, rel, map[attribute.Key]any{dlotel.AttrOutcome: "lost", dlotel.AttrErrorType: "lease_lost", dlotel.AttrKey: "k"})
	lost := f.span(t, dlotel.SpanLeaseLost)
	wantAttrs(t, lost, map[attribute.Key]any{dlotel.AttrLostReason: "refused", dlotel.AttrErrorType: "lease_lost"})
	rm := f.collect(t)
	if v := tally(rm, dlotel.MetricSessionActive, nil); v != 0 {
		t.Errorf("active sessions %d after the Release", v)
	}
	if n := tally(rm, dlotel.MetricSessionDuration, map[attribute.Key]string{dlotel.AttrOutcome: "lost"}); n != 1 {
		t.Errorf("session.duration{outcome=lost} count %d, want 1", n)
	}
	if n := tally(rm, dlotel.MetricSessionDuration, nil); n != 1 {
		t.Errorf("session.duration count %d, want 1", n)
	}
	if n := tally(rm, dlotel.MetricLeaseLost, map[attribute.Key]string{dlotel.AttrLostReason: "refused"}); n != 1 {
		t.Errorf("lease.lost{refused} = %d, want 1", n)
	}
	if u := f.unended(); len(u) != 0 {
		t.Errorf("spans never ended: %v", u)
	}
}
