package chaos

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
	"github.com/dislock/dislock/etcdlock"
	"github.com/dislock/dislock/mysqllock"
	"github.com/dislock/dislock/pg"
	"github.com/dislock/dislock/redislock"
	"github.com/dislock/dislock/zklock"
)

// semaphoreTier sizes a semaphore run for the tier: the short one (see
// semaphoreRun), or in the long tier seven contenders on three keys of three
// permits for 30 s of faults.
func semaphoreTier(seed uint64) runConfig {
	cfg := semaphoreRun(seed)
	if longTier() {
		cfg.contenders, cfg.keys, cfg.limit, cfg.faultPhase = 7, 3, 3, 30*time.Second
	}
	return cfg
}

// semaphoreSeeds are the tier's seeds, at most two: the semaphore runs
// come on top of the mutex runs of every backend.
func semaphoreSeeds() []uint64 {
	s := seeds()
	return s[:min(len(s), 2)]
}

// runSemaphore runs the workload with the keys as semaphores, after
// checking that backend (a value of the backend's type) holds semaphores.
// shortPhase, when not zero, replaces the short tier's fault phase.
func runSemaphore(t *testing.T, backend any, shortPhase time.Duration, setup func(t *testing.T, h *Harness, keys []string, prefix string) *backendEnv) {
	t.Helper()
	if _, ok := backend.(core.SemaphoreBackend); !ok {
		t.Skipf("%T is not a core.SemaphoreBackend", backend)
	}
	for i, seed := range semaphoreSeeds() {
		t.Run(fmt.Sprintf("seed%d", i), func(t *testing.T) {
			cfg := semaphoreTier(seed)
			if shortPhase > 0 && !longTier() {
				cfg.faultPhase = shortPhase
			}
			runChaos(t, cfg, setup)
		})
	}
}

// memSetup is the in-memory store as a backend of the workload, without a
// proxy and without servers: each contender's Locker has its own handle on
// one memlock.Store, and the faults are memlock's own, applied to every
// contender's handle at once (never to the admin's): the store unreachable,
// replies lost after the store applied a call, latency above the TTL, and
// the keys deleted behind the holders' backs.
func memSetup(t *testing.T, _ *Harness, _ []string, prefix string) *backendEnv {
	store := memlock.NewStore()
	admin, err := store.Locker()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var handles []*memlock.Backend
	all := func(f func(b *memlock.Backend)) {
		mu.Lock()
		defer mu.Unlock()
		for _, b := range handles {
			f(b)
		}
	}
	env := &backendEnv{name: "memory", admin: admin, keyPrefix: prefix}
	env.newLocker = func(_ context.Context, opts ...core.ClientOption) (core.Locker, func() error, error) {
		b := store.Backend()
		l, err := core.New(b, opts...)
		if err != nil {
			return nil, nil, err
		}
		mu.Lock()
		handles = append(handles, b)
		mu.Unlock()
		return l, l.Close, nil
	}
	env.deleteKeys = func(_ context.Context, keys []string) ([]removal, error) {
		for _, k := range keys {
			store.Delete(k)
		}
		return nil, nil // memlock does not say what it removed
	}
	env.probe = func(context.Context) error { return nil }
	ttl := shortTiming.ttl
	env.faults = []faultDef{
		{name: "mem-down", run: func(ctx context.Context, rng *mrand.Rand) error {
			all(func(b *memlock.Backend) { b.SetDown(true) })
			sleepCtx(ctx, between(rng, 300*time.Millisecond, 2500*time.Millisecond))
			all(func(b *memlock.Backend) { b.SetDown(false) })
			return nil
		}},
		{name: "mem-lose-replies", run: func(ctx context.Context, rng *mrand.Rand) error {
			all(func(b *memlock.Backend) { b.SetLoseReplies(true) })
			sleepCtx(ctx, between(rng, 300*time.Millisecond, 2500*time.Millisecond))
			all(func(b *memlock.Backend) { b.SetLoseReplies(false) })
			return nil
		}},
		{name: "mem-latency-above-ttl", run: func(ctx context.Context, rng *mrand.Rand) error {
			d := ttl + between(rng, 100*time.Millisecond, 700*time.Millisecond)
			all(func(b *memlock.Backend) { b.SetLatency(d) })
			sleepCtx(ctx, between(rng, time.Second, 3*time.Second))
			all(func(b *memlock.Backend) { b.SetLatency(0) })
			return nil
		}},
	}
	env.close = func() { _ = admin.Close() }
	return env
}

// TestChaosMemorySemaphore is the semaphore run on the in-memory store: no
// servers, so it always runs, and it checks the workload and the checker
// against the reference semantics (core/memlock). Its faults are cheap and
// in-process, so a shorter fault phase does.
func TestChaosMemorySemaphore(t *testing.T) {
	runSemaphore(t, (*memlock.Backend)(nil), 6*time.Second, memSetup)
}

// TestChaosEtcdSemaphore is the semaphore run on etcd: the proxy's faults,
// the server killed and restarted from its data, and deleted permit keys.
// Long tier only: the short tier's budget has no room for it.
func TestChaosEtcdSemaphore(t *testing.T) {
	if !longTier() {
		t.Skip("long tier only (-chaos.long or DISLOCK_CHAOS_LONG=1)")
	}
	runSemaphore(t, (*etcdlock.Backend)(nil), 0, etcdSetup)
}

// TestChaosZooKeeperSemaphore is the semaphore run on ZooKeeper: the
// proxy's faults, the server killed and restarted, and deleted permit
// nodes. Long tier only, as for etcd.
func TestChaosZooKeeperSemaphore(t *testing.T) {
	if !longTier() {
		t.Skip("long tier only (-chaos.long or DISLOCK_CHAOS_LONG=1)")
	}
	runSemaphore(t, (*zklock.Backend)(nil), 0, zkSetup)
}

// TestChaosMySQLSemaphore is the semaphore run on MySQL: the proxy's
// faults, the server killed and restarted, and deleted header and permit
// rows. Long tier only: the short tier's budget has no room for it.
func TestChaosMySQLSemaphore(t *testing.T) {
	if !longTier() {
		t.Skip("long tier only (-chaos.long or DISLOCK_CHAOS_LONG=1)")
	}
	runSemaphore(t, (*mysqllock.Backend)(nil), 0, mysqlSetup)
}

// TestChaosRedisSemaphore is the semaphore run on Redis: the proxy's faults,
// CLIENT PAUSE, a restart without persistence and deleted keys.
func TestChaosRedisSemaphore(t *testing.T) {
	runSemaphore(t, (*redislock.Backend)(nil), 0, redisSetup)
}

// TestChaosPGSemaphore is the semaphore run on PostgreSQL: the proxy's
// faults, pg_terminate_backend storms and deleted lock rows.
func TestChaosPGSemaphore(t *testing.T) {
	pgURL(t)
	runSemaphore(t, (*pg.Backend)(nil), 0, pgSetup)
}

// overGranting is a broken semaphore: it asks the store for one permit more
// than the engine requested, in every call alike, so the store hands out
// Limit+1 permits of a key while each holder believes the limit holds.
type overGranting struct {
	*memlock.Backend
}

func (b overGranting) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	if req.Limit > 1 {
		req.Limit++
	}
	return b.Backend.TryAcquire(ctx, req)
}

func (b overGranting) Renew(ctx context.Context, reqs []core.RenewRequest) ([]error, error) {
	out := append([]core.RenewRequest(nil), reqs...)
	for i := range out {
		if out[i].Limit > 1 {
			out[i].Limit++
		}
	}
	return b.Backend.Renew(ctx, out)
}

func (b overGranting) Release(ctx context.Context, req core.ReleaseRequest) error {
	if req.Limit > 1 {
		req.Limit++
	}
	return b.Backend.Release(ctx, req)
}

// TestCheckerCatchesOverGrantingSemaphore runs three holders of a
// semaphore of two permits through the real engine and the workload's
// steps, recorded as the chaos runs record them: on an honest store the
// third is refused and the history is clean; on a store that grants one
// permit too many all three hold at once and the checker names the rule.
func TestCheckerCatchesOverGrantingSemaphore(t *testing.T) {
	tm := timing{ttl: 600 * time.Millisecond, interval: 200 * time.Millisecond, deadline: 400 * time.Millisecond}
	check := Config{RenewDeadline: tm.deadline, Slack: 50 * time.Millisecond, LossSlack: lossSlack, StopSlack: 150 * time.Millisecond, Limit: 2}
	history := func(t *testing.T, wrap func(*memlock.Backend) core.Backend) (History, int) {
		store := memlock.NewStore()
		rec := NewRecorder(3)
		errs := &sink{}
		var counter atomic.Int64
		r := &run{t: t, cfg: runConfig{timing: tm, limit: 2}, env: &backendEnv{}, rec: rec, errs: errs, ctx: context.Background(),
			counters: map[string]*atomic.Int64{"k": &counter}}
		var wg sync.WaitGroup
		granted := 0
		for i := range 3 {
			name := fmt.Sprintf("c%d", i)
			o := newRecObserver(rec, name, errs)
			l, err := core.New(wrap(store.Backend()), core.WithDefaults(tm.options()...), core.WithObserver(o))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			c := &contender{name: name, l: l, obs: o, rng: mrand.New(mrand.NewPCG(3, uint64(i)))}
			rec.Add(Event{Kind: AcquireStart, Contender: name, Key: "k"})
			s, err := l.TryAcquire(context.Background(), "k", core.Limit(2))
			if err != nil {
				if !errors.Is(err, core.ErrNotAcquired) {
					t.Fatalf("%s: %v", name, err)
				}
				rec.Add(Event{Kind: AcquireBusy, Contender: name, Key: "k", Err: err.Error()})
				continue
			}
			granted++
			id := o.hold(s)
			wg.Add(1)
			go func() {
				defer wg.Done()
				r.work(c, s, id, "k", 150*time.Millisecond)
				r.finish(c, s, id, "k")
			}()
		}
		wg.Wait()
		return rec.History(), granted
	}

	hist, granted := history(t, func(b *memlock.Backend) core.Backend { return b })
	if rep := Check(hist, check); granted != 2 || !rep.OK() || rep.MaxHolds["k"] != 2 {
		t.Fatalf("honest store: %d permits granted (want 2), most at once %d:\n%s", granted, rep.MaxHolds["k"], rep)
	}
	hist, granted = history(t, func(b *memlock.Backend) core.Backend { return overGranting{b} })
	rep := Check(hist, check)
	if granted != 3 || len(rep.Violations) == 0 || rep.Violations[0].Rule != RuleOverLimit {
		t.Fatalf("over-granting store: %d permits granted (want 3); want %q first:\n%s", granted, RuleOverLimit, rep)
	}
	for _, v := range rep.Violations {
		if v.Rule != RuleOverLimit {
			t.Errorf("unexpected violation %q:\n%s", v.Rule, rep)
		}
	}
	if out := rep.String(); !strings.Contains(out, "3 holds at once, limit 2") {
		t.Errorf("the counterexample lacks the count:\n%s", out)
	}
	t.Logf("counterexample:\n%s", firstLines(rep.String(), 6))
}
