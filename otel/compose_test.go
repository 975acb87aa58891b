package otel_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/locktest"
	"github.com/dislock/dislock/core/memlock"
	"github.com/dislock/dislock/internal/testenv"
	dlotel "github.com/dislock/dislock/otel"
)

// tagObserver is a non-otel Observer that puts its own value in every
// context it returns, between the two otel Observers.
type tagObserver struct{ core.NopObserver }

type tagKey struct{}

func (tagObserver) AcquireStart(ctx context.Context, _ core.AcquireStartEvent) context.Context {
	return context.WithValue(ctx, tagKey{}, "tag")
}

func (tagObserver) ReleaseStart(ctx context.Context, _ core.ReleaseStartEvent) context.Context {
	return context.WithValue(ctx, tagKey{}, "tag")
}

func nameCounts(spans []sdktrace.ReadOnlySpan) map[string]int {
	m := map[string]int{}
	for _, s := range spans {
		m[s.Name()]++
	}
	return m
}

// Two otel Observers composed (with another Observer between them) each
// see every event: every span they start ends, their spans are the same,
// children of the caller's span rather than of each other's, and each
// records every measurement.
func TestComposedObservers(t *testing.T) {
	f1, f2 := newFixture(t), newFixture(t)
	store := memlock.NewStore()
	obs := core.Observers(f1.obs, tagObserver{}, f2.obs)
	newLocker := func() *core.Client {
		return testenv.Client(t, store.Backend(), core.WithObserver(obs), core.WithDefaults(core.TTL(150*time.Millisecond)))
	}
	a, b := newLocker(), newLocker()
	caller := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
	defer caller.Shutdown(context.Background())
	ctx, req := caller.Tracer("test").Start(context.Background(), "request")
	defer req.End()

	s1 := testenv.Hold(t, ctx, a, "k1")
	if _, err := b.TryAcquire(ctx, "k1"); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatal(err)
	}
	s2 := testenv.AcquireReleased(t, ctx, b, s1, 30*time.Millisecond, 10*time.Second)
	s3 := testenv.Hold(t, ctx, a, "k3")
	for _, f := range []*fixture{f1, f2} {
		eventually(t, "a renew span", func() bool { return len(f.spans(dlotel.SpanRenew)) >= 1 })
	}
	store.Steal("k3")
	<-s3.Done()
	for _, f := range []*fixture{f1, f2} {
		eventually(t, "the loss", func() bool { return len(f.spans(dlotel.SpanLeaseLost)) == 1 })
	}
	if err := s2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	a.Close()
	b.Close()

	var counts []map[string]int
	var wakes []string
	for i, f := range []*fixture{f1, f2} {
		if u := f.unended(); len(u) != 0 {
			t.Errorf("observer %d: spans never ended: %v", i+1, u)
		}
		c := nameCounts(f.sr.Ended())
		c[dlotel.SpanRenew] = min(c[dlotel.SpanRenew], 1) // renewals differ in number
		counts = append(counts, c)
		want := map[string]int{dlotel.SpanAcquire: 4, dlotel.SpanRelease: 2, dlotel.SpanLeaseLost: 1, dlotel.SpanRenew: 1}
		if fmt.Sprint(c) != fmt.Sprint(want) {
			t.Errorf("observer %d: spans %v, want %v", i+1, c, want)
		}
		for _, s := range f.spans(dlotel.SpanAcquire) {
			if s.Parent().SpanID() != req.SpanContext().SpanID() {
				t.Errorf("observer %d: acquire span's parent %v, want the caller's span", i+1, s.Parent().SpanID())
			}
		}
		for _, s := range f.spans(dlotel.SpanRelease) {
			if s.Parent().SpanID() != req.SpanContext().SpanID() || len(s.Links()) != 1 {
				t.Errorf("observer %d: release span's parent %v, links %v", i+1, s.Parent().SpanID(), s.Links())
			}
		}
		if acqs := f.spans(dlotel.SpanAcquire); len(acqs) == 4 {
			wantAttrs(t, acqs[2], map[attribute.Key]any{dlotel.AttrOutcome: "acquired", dlotel.AttrMode: "wait"})
			wakes = append(wakes, attrs(acqs[2])[dlotel.AttrWake].Emit())
		}
		if lost := f.spans(dlotel.SpanLeaseLost); len(lost) == 1 {
			wantAttrs(t, lost[0], map[attribute.Key]any{dlotel.AttrLostReason: "refused", dlotel.AttrKey: "k3"})
			if len(lost[0].Links()) != 2 {
				t.Errorf("observer %d: lease_lost links %v, want the acquisition and the renewal", i+1, lost[0].Links())
			}
		}

		rm := f.collect(t)
		if v := tally(rm, dlotel.MetricSessionActive, nil); v != 0 {
			t.Errorf("observer %d: %s = %d after all ended", i+1, dlotel.MetricSessionActive, v)
		}
		if n := tally(rm, dlotel.MetricSessionDuration, map[attribute.Key]string{dlotel.AttrOutcome: "released"}); n != 2 {
			t.Errorf("observer %d: %s{released} count %d, want 2", i+1, dlotel.MetricSessionDuration, n)
		}
		if n := tally(rm, dlotel.MetricSessionDuration, map[attribute.Key]string{dlotel.AttrOutcome: "lost"}); n != 1 {
			t.Errorf("observer %d: %s{lost} count %d, want 1", i+1, dlotel.MetricSessionDuration, n)
		}
		if n := tally(rm, dlotel.MetricLeaseLost, nil); n != 1 {
			t.Errorf("observer %d: %s = %d, want 1", i+1, dlotel.MetricLeaseLost, n)
		}
		if n := tally(rm, dlotel.MetricAcquireDuration, nil); n != 4 {
			t.Errorf("observer %d: %s count %d, want 4", i+1, dlotel.MetricAcquireDuration, n)
		}
		if n := tally(rm, dlotel.MetricRenewDuration, nil); n == 0 {
			t.Errorf("observer %d: no renewal measured", i+1)
		}
	}
	if len(wakes) != 2 || wakes[0] == "" || wakes[0] != wakes[1] {
		t.Errorf("the wait's dislock.wake as the observers saw it: %q", wakes)
	}
	if fmt.Sprint(counts[0]) != fmt.Sprint(counts[1]) {
		t.Errorf("the observers saw different spans: %v and %v", counts[0], counts[1])
	}
}

// TestConformanceComposed runs the locktest suite with two otel Observers
// composed: they change no behaviour, and both see the same events.
func TestConformanceComposed(t *testing.T) {
	t.Parallel() // its own store and providers; the suites mostly wait on timers
	f1, f2 := newFixture(t), newFixture(t)
	store := memlock.NewStore()
	locktest.Run(t, locktest.Harness{
		NewBackend:    func(testing.TB) core.Backend { return store.Backend() },
		ClientOptions: []core.ClientOption{core.WithObserver(f1.obs), core.WithObserver(f2.obs)},
		Steal:         func(_ context.Context, key string) error { store.Steal(key); return nil },
		Delete:        func(_ context.Context, key string) error { store.Delete(key); return nil },
		TTL:           600 * time.Millisecond,
	})
	c1, c2 := nameCounts(f1.sr.Ended()), nameCounts(f2.sr.Ended())
	if c1[dlotel.SpanAcquire] == 0 || c1[dlotel.SpanLeaseLost] == 0 || c1[dlotel.SpanRelease] == 0 {
		t.Errorf("the suite ran without the observer seeing acquisitions, releases and losses: %v", c1)
	}
	for _, name := range []string{dlotel.SpanAcquire, dlotel.SpanRelease, dlotel.SpanLeaseLost} {
		if c1[name] != c2[name] {
			t.Errorf("%s: %d spans in the first observer, %d in the second", name, c1[name], c2[name])
		}
	}
	for i, f := range []*fixture{f1, f2} {
		if u := f.unended(); len(u) != 0 {
			t.Errorf("observer %d: %d spans never ended: %v", i+1, len(u), u)
		}
	}
	r1, r2 := f1.collect(t), f2.collect(t)
	for _, m := range []string{dlotel.MetricAcquireDuration, dlotel.MetricSessionDuration} {
		if n1, n2 := tally(r1, m, nil), tally(r2, m, nil); n1 == 0 || n1 != n2 {
			t.Errorf("%s: count %d in the first observer, %d in the second", m, n1, n2)
		}
	}
	for _, m := range []string{dlotel.MetricSessionActive, dlotel.MetricLeaseLost} {
		if v1, v2 := tally(r1, m, nil), tally(r2, m, nil); v1 != v2 {
			t.Errorf("%s: %d in the first observer, %d in the second", m, v1, v2)
		}
	}
}
