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
	l, err := core.New(b, core.WithObserver(f.obs), core.WithDefaults(opts...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
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
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
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

func TestAcquireAndRelease(t *testing.T) {
	f := newFixture(t)
	l := f.locker(t)
	ctx, parent := f.tp.Tracer("test").Start(context.Background(), "job")
	s, err := l.TryAcquire(ctx, "reports")
	if err != nil {
		t.Fatal(err)
	}
	parent.End()
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
		dlotel.AttrBackend: "memory", dlotel.AttrMode: "try", dlotel.AttrOutcome: "acquired",
		dlotel.AttrAttempts: 1, dlotel.AttrKey: "reports", dlotel.AttrToken: s.Token(),
	}, dlotel.AttrErrorType)
	if _, ok := attrs(acq)[dlotel.AttrWaitSeconds]; !ok {
		t.Error("acquire span has no wait time")
	}
	if is := acq.InstrumentationScope(); is.Name != dlotel.ScopeName || is.Version != dlotel.Version {
		t.Errorf("scope %+v", is)
	}

	if err := s.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	rel := f.span(t, dlotel.SpanRelease)
	if rel.Parent().SpanID() != acq.SpanContext().SpanID() || rel.SpanContext().TraceID() != acq.SpanContext().TraceID() {
		t.Errorf("release span is not a child of the acquire span")
	}
	wantAttrs(t, rel, map[attribute.Key]any{
		dlotel.AttrBackend: "memory", dlotel.AttrMode: "try", dlotel.AttrOutcome: "released",
		dlotel.AttrKey: "reports", dlotel.AttrToken: s.Token(),
	})
	if rel.Status().Code != codes.Unset {
		t.Errorf("release status %v", rel.Status())
	}
	// A second Release does nothing and emits nothing.
	_ = s.Release(context.Background())
	if n := len(f.spans(dlotel.SpanRelease)); n != 1 {
		t.Errorf("%d release spans after a repeated Release, want 1", n)
	}
}

func TestBusyIsAnOutcomeNotAnError(t *testing.T) {
	f := newFixture(t)
	a, b := f.locker(t), f.locker(t)
	s, err := a.TryAcquire(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release(context.Background())
	if _, err := b.TryAcquire(context.Background(), "k"); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("second TryAcquire: %v", err)
	}
	spans := f.spans(dlotel.SpanAcquire)
	if len(spans) != 2 {
		t.Fatalf("%d acquire spans", len(spans))
	}
	busy := spans[1]
	wantAttrs(t, busy, map[attribute.Key]any{dlotel.AttrOutcome: "busy", dlotel.AttrMode: "try", dlotel.AttrAttempts: 1},
		dlotel.AttrToken, dlotel.AttrErrorType)
	if busy.Status().Code != codes.Unset || hasEvent(busy, "exception") {
		t.Errorf("busy acquire has status %v / events %v; contention is not an error", busy.Status(), busy.Events())
	}
}

func TestWaitTimeout(t *testing.T) {
	f := newFixture(t)
	a, b := f.locker(t), f.locker(t)
	s, err := a.TryAcquire(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Millisecond)
	defer cancel()
	if _, err := b.Acquire(ctx, "k", core.Backoff(5*time.Millisecond, 10*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire: %v", err)
	}
	sp := f.spans(dlotel.SpanAcquire)[1]
	wantAttrs(t, sp, map[attribute.Key]any{dlotel.AttrOutcome: "timeout", dlotel.AttrMode: "wait"}, dlotel.AttrErrorType)
	if sp.Status().Code != codes.Unset {
		t.Errorf("timeout status %v", sp.Status())
	}
	if n := attrs(sp)[dlotel.AttrAttempts].AsInt64(); n < 2 {
		t.Errorf("attempts %d, want several", n)
	}
	if w := attrs(sp)[dlotel.AttrWaitSeconds].AsFloat64(); w < 0.05 {
		t.Errorf("wait %vs, want ≥ 0.05", w)
	}
}

func TestSlotMode(t *testing.T) {
	f := newFixture(t)
	l := f.locker(t)
	s, err := l.TryAcquire(context.Background(), "tick", core.ForSlot(core.Every(time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	wantAttrs(t, f.span(t, dlotel.SpanAcquire), map[attribute.Key]any{dlotel.AttrMode: "slot"})
	wantAttrs(t, f.span(t, dlotel.SpanRelease), map[attribute.Key]any{dlotel.AttrMode: "slot", dlotel.AttrOutcome: "kept"})
}

func TestRenewSpans(t *testing.T) {
	f := newFixture(t, dlotel.WithRenewSpans(true))
	l := f.locker(t, core.TTL(150*time.Millisecond))
	s, err := l.TryAcquire(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "a renew span", func() bool { return len(f.spans(dlotel.SpanRenew)) >= 2 })
	if err := s.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	acq := f.span(t, dlotel.SpanAcquire)
	for _, r := range f.spans(dlotel.SpanRenew) {
		if r.Parent().SpanID() != acq.SpanContext().SpanID() || r.SpanContext().TraceID() != acq.SpanContext().TraceID() {
			t.Errorf("renew span is not a child of the acquire span")
		}
		wantAttrs(t, r, map[attribute.Key]any{
			dlotel.AttrOutcome: "renewed", dlotel.AttrToken: s.Token(), dlotel.AttrKey: "k", dlotel.AttrMode: "try",
		})
		if r.Status().Code != codes.Unset {
			t.Errorf("renew status %v", r.Status())
		}
	}
}

func TestRenewSpansOffByDefault(t *testing.T) {
	f := newFixture(t)
	l := f.locker(t, core.TTL(90*time.Millisecond))
	s, err := l.TryAcquire(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "two renewals measured", func() bool {
		return histCount(f.collect(t), dlotel.MetricRenewDuration, nil) >= 2
	})
	s.Release(context.Background())
	if n := len(f.spans(dlotel.SpanRenew)); n != 0 {
		t.Errorf("%d renew spans for successful renewals, want none by default", n)
	}
}

func TestLeaseLost(t *testing.T) {
	f := newFixture(t)
	l := f.locker(t, core.TTL(150*time.Millisecond))
	s, err := l.TryAcquire(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
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
		return sumValue(f.collect(t), dlotel.MetricLeasesLost, nil) == 1
	})
	acq := f.span(t, dlotel.SpanAcquire)
	lost := f.span(t, dlotel.SpanLeaseLost)
	if lost.Parent().IsValid() || lost.SpanContext().TraceID() == acq.SpanContext().TraceID() {
		t.Errorf("lease_lost span is not a new root")
	}
	if links := lost.Links(); len(links) != 1 || !links[0].SpanContext.Equal(acq.SpanContext()) {
		t.Errorf("lease_lost links %v, want the acquire span", links)
	}
	if lost.Status().Code != codes.Error || !hasEvent(lost, "exception") {
		t.Errorf("lease_lost status %v events %v", lost.Status(), lost.Events())
	}
	wantAttrs(t, lost, map[attribute.Key]any{
		dlotel.AttrErrorType: "lease_lost", dlotel.AttrToken: s.Token(), dlotel.AttrKey: "k", dlotel.AttrMode: "try",
	})
	if _, ok := attrs(lost)[dlotel.AttrHeldSeconds]; !ok {
		t.Error("lease_lost has no held time")
	}
	// The refused renewal gets a span although renew spans are off.
	renew := f.span(t, dlotel.SpanRenew)
	if renew.Parent().SpanID() != acq.SpanContext().SpanID() || renew.Status().Code != codes.Error {
		t.Errorf("refused renew span: parent %v status %v", renew.Parent().SpanID(), renew.Status())
	}
	wantAttrs(t, renew, map[attribute.Key]any{dlotel.AttrOutcome: "lost", dlotel.AttrErrorType: "lease_lost"})

	rm := f.collect(t)
	if v := sumValue(rm, dlotel.MetricSessionsActive, nil); v != 0 {
		t.Errorf("active sessions %d after the loss", v)
	}
	if n := histCount(rm, dlotel.MetricHeldDuration, map[attribute.Key]string{dlotel.AttrOutcome: "lost"}); n != 1 {
		t.Errorf("held.duration{outcome=lost} count %d", n)
	}
	// Release after a loss is a no-op: no span, no second decrement.
	s.Release(context.Background())
	if len(f.spans(dlotel.SpanRelease)) != 0 {
		t.Error("release span after a loss")
	}
	if v := sumValue(f.collect(t), dlotel.MetricSessionsActive, nil); v != 0 {
		t.Errorf("active sessions %d after Release of a lost session", v)
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

func histCount(rm metricdata.ResourceMetrics, name string, match map[attribute.Key]string) uint64 {
	m := find(rm, name)
	if m == nil {
		return 0
	}
	var n uint64
	for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
		if matches(dp.Attributes, match) {
			n += dp.Count
		}
	}
	return n
}

func sumValue(rm metricdata.ResourceMetrics, name string, match map[attribute.Key]string) int64 {
	m := find(rm, name)
	if m == nil {
		return 0
	}
	var n int64
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		if matches(dp.Attributes, match) {
			n += dp.Value
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

	sa, err := a.TryAcquire(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquire(ctx, "a"); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatal(err)
	}
	sb, err := a.TryAcquire(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	rm := f.collect(t)
	if v := sumValue(rm, dlotel.MetricSessionsActive, map[attribute.Key]string{dlotel.AttrBackend: "memory", dlotel.AttrMode: "try"}); v != 2 {
		t.Errorf("active sessions %d with two held, want 2", v)
	}
	sa.Release(ctx)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	_, err = b.Acquire(wctx, "b")
	cancel()
	if !errors.Is(err, core.ErrNotAcquired) {
		t.Fatal(err)
	}
	sb.Release(ctx)
	sb.Release(ctx) // idempotent: counted once

	rm = f.collect(t)
	for _, c := range []struct {
		mode, outcome string
		want          uint64
	}{{"try", "acquired", 2}, {"try", "busy", 1}, {"wait", "timeout", 1}, {"wait", "acquired", 0}} {
		got := histCount(rm, dlotel.MetricAcquireDuration, map[attribute.Key]string{
			dlotel.AttrBackend: "memory", dlotel.AttrMode: c.mode, dlotel.AttrOutcome: c.outcome})
		if got != c.want {
			t.Errorf("acquire.duration{%s,%s} count = %d, want %d", c.mode, c.outcome, got, c.want)
		}
	}
	if v := sumValue(rm, dlotel.MetricSessionsActive, nil); v != 0 {
		t.Errorf("active sessions %d after releasing all", v)
	}
	if n := histCount(rm, dlotel.MetricHeldDuration, map[attribute.Key]string{dlotel.AttrOutcome: "released", dlotel.AttrMode: "try"}); n != 2 {
		t.Errorf("held.duration{released} count %d, want 2", n)
	}
	if m := find(rm, dlotel.MetricLeasesLost); m != nil && sumValue(rm, dlotel.MetricLeasesLost, nil) != 0 {
		t.Errorf("leases lost without a loss")
	}
	m := find(rm, dlotel.MetricAcquireDuration)
	if m.Unit != "s" {
		t.Errorf("acquire.duration unit %q", m.Unit)
	}
	dp := m.Data.(metricdata.Histogram[float64]).DataPoints[0]
	if b := dp.Bounds; len(b) == 0 || b[0] != 0.0001 || b[len(b)-1] != 30 {
		t.Errorf("acquire.duration bounds %v, want 0.0001 … 30", b)
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
			s, err := l.TryAcquire(ctx, fmt.Sprintf("job-%d", i))
			if err != nil {
				t.Fatal(err)
			}
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
		s, err := l.TryAcquire(context.Background(), k)
		if err != nil {
			t.Fatal(err)
		}
		s.Release(context.Background())
	}
	rm := f.collect(t)
	if n := histCount(rm, dlotel.MetricAcquireDuration, map[attribute.Key]string{"job": "backup", dlotel.AttrBackend: "memory"}); n != 2 {
		t.Errorf("acquire.duration{job=backup} count %d, want 2", n)
	}
	if n := histCount(rm, dlotel.MetricHeldDuration, map[attribute.Key]string{"job": "report"}); n != 1 {
		t.Errorf("held.duration{job=report} count %d, want 1", n)
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
			f := newFixture(t, dlotel.WithKey(c.mode))
			fb := &failing{Backend: f.store.Backend()}
			l := f.lockerOn(t, fb)
			fb.acquire.Store(true)
			if _, err := l.TryAcquire(context.Background(), key); err == nil {
				t.Fatal("acquire did not fail")
			}
			fb.acquire.Store(false)
			s, err := l.TryAcquire(context.Background(), key)
			if err != nil {
				t.Fatal(err)
			}
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
	if _, err := dlotel.New(dlotel.WithKey(dlotel.KeyMode(42))); err == nil {
		t.Error("New accepted an unknown KeyMode")
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
	s, err := l.TryAcquire(ctx, "k2")
	if err != nil {
		t.Fatal(err)
	}
	fb.release.Store(true)
	if err := s.Release(ctx); err == nil {
		t.Fatal("release did not fail")
	}
	fb.release.Store(false)
	s.Release(ctx)
	// Failed renewals until the renew deadline passes: a loss.
	s, err = l.TryAcquire(ctx, "k3")
	if err != nil {
		t.Fatal(err)
	}
	fb.renew.Store(true)
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("loss not signalled")
	}
	eventually(t, "the loss recorded", func() bool { return len(f.spans(dlotel.SpanLeaseLost)) == 1 })
	fb.renew.Store(false)

	var failed int
	for _, sp := range f.sr.Ended() {
		if where := findString(sp, "SENTINELPW"); where != "" {
			t.Errorf("the password appears in %s's %s", sp.Name(), where)
		}
		if sp.Status().Code == codes.Error {
			failed++
			if !hasEvent(sp, "exception") || attrs(sp)[dlotel.AttrErrorType].Emit() == "" {
				t.Errorf("%s failed without an exception event or error.type", sp.Name())
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
	if n := histCount(rm, dlotel.MetricAcquireDuration, map[attribute.Key]string{dlotel.AttrOutcome: "error", dlotel.AttrErrorType: "backend"}); n != 1 {
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

func TestDefaultsToGlobalProviders(t *testing.T) {
	obs, err := dlotel.New(dlotel.WithTracerProvider(nil), dlotel.WithMeterProvider(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := memlock.New(core.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	s, err := l.TryAcquire(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	s.Release(context.Background())
}

// TestConformance runs the locktest suite over memlock with the observer
// installed: the observer changes no behaviour.
func TestConformance(t *testing.T) {
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
	l, err := memlock.New(core.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	s, err := l.TryAcquire(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	s.Release(context.Background())
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
	s, err := l.TryAcquire(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
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
	if v := sumValue(rm, dlotel.MetricSessionsActive, nil); v != 0 {
		t.Errorf("active sessions %d, want 0", v)
	}
	if n := histCount(rm, dlotel.MetricHeldDuration, nil); n != 2 {
		t.Errorf("held.duration count %d, want 2 (one per session)", n)
	}
}
