package chaos

import (
	"context"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
)

// lyingBackend breaks the engine's local deadline: it reports every renewal
// as applied although the store never saw it, so the session's deadline
// keeps moving while the store lets the lease expire. This is what a holder
// looks like whose deadline is disabled.
type lyingBackend struct {
	*memlock.Backend
}

func (b lyingBackend) Renew(ctx context.Context, reqs []core.RenewRequest) ([]error, error) {
	_, _ = b.Backend.Renew(ctx, reqs)
	return make([]error, len(reqs)), nil
}

// TestCheckerCatchesBrokenEngine runs the real engine with a broken
// component, records the history exactly as the chaos runs do, and shows the
// checker rejects it with a readable counterexample.
func TestCheckerCatchesBrokenEngine(t *testing.T) {
	store := memlock.NewStore()
	rec := NewRecorder(7)
	errs := &sink{}
	tm := timing{ttl: 600 * time.Millisecond, interval: 200 * time.Millisecond, deadline: 400 * time.Millisecond}
	opts := func(name string) (*recObserver, []core.ClientOption) {
		o := newRecObserver(rec, name, errs)
		return o, []core.ClientOption{core.WithDefaults(tm.options()...), core.WithObserver(o)}
	}
	liar := lyingBackend{store.Backend()}
	oa, co := opts("broken")
	a, err := core.New(liar, co...)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ob, co := opts("healthy")
	b, err := store.Locker(co...)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()

	var counter atomic.Int64
	r := &run{t: t, cfg: runConfig{timing: tm}, env: &backendEnv{}, rec: rec, errs: errs, ctx: context.Background(),
		counters: map[string]*atomic.Int64{"k": &counter}}
	ca := &contender{name: "broken", l: a, obs: oa}
	cb := &contender{name: "healthy", l: b, obs: ob, rng: mrand.New(mrand.NewPCG(7, 1))}

	ctx := context.Background()
	rec.Add(Event{Kind: AcquireStart, Contender: ca.name, Key: "k"})
	sa, err := a.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	ida := oa.hold(sa)
	liar.SetDown(true) // the store no longer hears from the holder
	rec.Add(Event{Kind: FaultStart, Fault: "holder cut off"})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the broken holder keeps working: its session looks fine
		defer wg.Done()
		for end := time.Now().Add(3 * tm.ttl); time.Now().Before(end); {
			v := counter.Load()
			rec.Add(Event{Kind: CounterRead, Contender: ca.name, Key: "k", Hold: ida, Token: sa.Token(), Value: v})
			time.Sleep(30 * time.Millisecond)
			if sa.Err() != nil || !time.Now().Before(sa.Deadline()) {
				return
			}
			now := time.Now()
			counter.Store(v + 1)
			rec.Add(Event{At: rec.Since(now), Kind: CounterWrite, Contender: ca.name, Key: "k", Hold: ida, Token: sa.Token(), Read: v, Value: v + 1})
		}
	}()
	for range 3 { // meanwhile the store gives the key to a healthy contender
		r.iteration(cb, "k", 2*tm.ttl, 50*time.Millisecond)
	}
	wg.Wait()
	rec.Add(Event{Kind: WorkStopped, Contender: ca.name, Key: "k", Hold: ida, Token: sa.Token()})
	rec.Add(Event{Kind: ReleaseStart, Contender: ca.name, Key: "k", Hold: ida, Token: sa.Token()})
	_ = sa.Release(ctx)
	rec.Add(Event{Kind: HoldEnd, Contender: ca.name, Key: "k", Hold: ida, Token: sa.Token(), Deadline: rec.Since(sa.Deadline())})
	rec.Add(Event{Kind: FaultEnd, Fault: "holder cut off"})

	hist := rec.History()
	if os.Getenv("DISLOCK_CHAOS_WRITE_TESTDATA") == "1" {
		f, err := os.Create(filepath.Join("testdata", "broken-engine.json"))
		if err != nil {
			t.Fatal(err)
		}
		_ = hist.WriteJSON(f)
		f.Close()
	}
	rep := Check(hist, Config{RenewDeadline: tm.deadline, Slack: 50 * time.Millisecond, LossSlack: lossSlack})
	if rep.OK() {
		t.Fatalf("the checker accepted the history of a broken engine:\n%s", rep)
	}
	found := map[string]bool{}
	for _, v := range rep.Violations {
		found[v.Rule] = true
	}
	if !found[RuleOverlap] || !found[RuleLostUpdate] {
		t.Errorf("want %q and %q among the violations:\n%s", RuleOverlap, RuleLostUpdate, rep)
	}
	out := rep.String()
	for _, want := range []string{"seed 7", "(broken,", "(healthy,", "none allowed", "holder cut off"} {
		if !strings.Contains(out, want) {
			t.Errorf("the counterexample lacks %q:\n%s", want, out)
		}
	}
	t.Logf("counterexample from a recorded bad history (first lines):\n%s", firstLines(out, 12))
}

// TestCheckerRecordedBadHistory checks a history recorded from the broken
// engine above (testdata/broken-engine.json; rewrite it with
// DISLOCK_CHAOS_WRITE_TESTDATA=1): the verdict must not depend on a lucky
// schedule.
func TestCheckerRecordedBadHistory(t *testing.T) {
	f, err := os.Open(filepath.Join("testdata", "broken-engine.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h, err := ReadHistory(f)
	if err != nil {
		t.Fatal(err)
	}
	rep := Check(h, Config{RenewDeadline: 400 * time.Millisecond, Slack: 50 * time.Millisecond, LossSlack: lossSlack})
	if rep.OK() || rep.Violations[0].Rule != RuleOverlap || rep.Violations[0].A.Contender != "broken" {
		t.Fatalf("want an overlap with the broken holder first:\n%s", rep)
	}
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}
