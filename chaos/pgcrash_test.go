package chaos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/pg"
)

// pgMode is one of the pg package's durability modes.
type pgMode struct {
	name string
	opts []pg.Option
	// stateLoss: a crash may lose acknowledged acquisitions.
	stateLoss bool
}

var pgModes = []pgMode{
	{name: "durable"},
	{name: "async", opts: []pg.Option{pg.WithAsyncCommit()}, stateLoss: true},
	{name: "unlogged", opts: []pg.Option{pg.WithUnlogged()}, stateLoss: true},
}

// privatePool connects to the private server.
func privatePool(t testing.TB, srv *pgServer, app string, conns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(srv.url())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.ConnConfig.ConnectTimeout = time.Second
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("connect to the private PostgreSQL: %v", err)
	}
	return pool
}

// TestChaosPGCrash crashes a private PostgreSQL server (SIGKILL of the
// postmaster and all its processes) while holders and waiters run, once per
// durability mode, restarts it, and checks that what survived is what the
// pg package documents: with durable commits every acknowledged acquisition;
// with WithAsyncCommit all but those of the last 3×wal_writer_delay; with
// WithUnlogged nothing. In every mode fencing tokens keep increasing across
// the crash, and each holder either keeps its lock or is told it lost it.
// Then the server restarts (clean shutdown) under LISTEN waiters, which must
// resubscribe and wake on the next release.
func TestChaosPGCrash(t *testing.T) {
	srv := startPGServer(t)
	for _, m := range pgModes {
		t.Run(m.name, func(t *testing.T) { pgCrashRun(t, srv, m) })
	}
	t.Run("RestartWithWaiters", func(t *testing.T) { pgRestartWaiters(t, srv) })
}

func pgCrashRun(t *testing.T, srv *pgServer, mode pgMode) {
	ctx := context.Background()
	name := "pg-" + mode.name
	prefix := runPrefix(name)
	table := "dislock_crash_" + mode.name
	keys := []string{prefix + "hot-0", prefix + "hot-1"}
	logs := &sink{}
	rec := NewRecorder(0)

	adminPool := privatePool(t, srv, "dislock-chaos-admin", 4)
	defer adminPool.Close()
	adminB, err := pg.NewBackend(ctx, adminPool, append([]pg.Option{pg.WithTable(table), pg.WithAutoMigrate()}, mode.opts...)...)
	if err != nil {
		t.Fatalf("lock table: %v", err)
	}
	admin, err := core.New(adminB)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	newLocker := func(ctx context.Context, app string, opts ...core.ClientOption) (core.Locker, func() error, error) {
		pool := privatePool(t, srv, app, 3)
		l, err := pg.New(ctx, pool, append([]pg.Option{pg.WithTable(table), pg.WithClientOptions(opts...)}, mode.opts...)...)
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		return l, func() error { err := l.Close(); pool.Close(); return err }, nil
	}
	env := &backendEnv{name: name, admin: admin, keyPrefix: prefix}
	env.newLocker = func(ctx context.Context, opts ...core.ClientOption) (core.Locker, func() error, error) {
		return newLocker(ctx, "dislock-chaos-contender", opts...)
	}
	env.probe = func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, srv.url())
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		_, err = conn.Exec(ctx, "SELECT 1")
		return err
	}
	defer withRegister(t, env, keys)() // the fenced register lives elsewhere: it survives the crash

	w, endWitness := startWitness(t, rec, logs, prefix, 10*time.Millisecond,
		func(ctx context.Context, opts ...core.ClientOption) (core.Locker, func() error, error) {
			return newLocker(ctx, "dislock-chaos-witness", opts...)
		})
	defer endWitness()

	crash, cc := crashStep("pg-crash-"+mode.name, mode.stateLoss, srv.crash, srv.start)
	cfg := runConfig{contenders: 3, keys: len(keys), timing: shortTiming}
	rep, allowed := runSteps(t, cfg, env, keys, rec, logs, 2*time.Second, []stepFault{crash})
	if !mode.stateLoss && len(allowed) > 0 {
		t.Errorf("durable commits: a crash must not let two holders in, but %d violations came from it", len(allowed))
	}

	// Every witness holder has renewed (or been refused) since the restart.
	w.halt()
	look := func(ctx context.Context, keys []string) (map[string]uint64, error) {
		rows, err := adminPool.Query(ctx, `SELECT key, token FROM `+pgx.Identifier{table}.Sanitize()+` WHERE key = ANY($1)`, keys)
		if err != nil {
			return nil, err
		}
		out := map[string]uint64{}
		var k string
		var tok int64
		_, err = pgx.ForEachRow(rows, []any{&k, &tok}, func() error {
			out[k] = uint64(tok)
			return nil
		})
		return out, err
	}
	figs := w.measure(t, rec.History(), look)
	if len(figs) != 1 {
		t.Fatalf("want the figures of one crash, got %d", len(figs))
	}
	f := figs[0]
	var before int
	if err := adminPool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{table}.Sanitize()+` WHERE acquired_at < $1`, cc.killedAt).Scan(&before); err != nil {
		t.Fatal(err)
	}
	regressions := f.Regressions + tokenRegressions(rep)
	figure(t, "PostgreSQL crash, %s: %v; server down %v; %d rows from before the crash left; %d token regressions in the contenders' history",
		mode.name, f, cc.down.Round(time.Millisecond), before, tokenRegressions(rep))

	checkCrash(t, f, regressions)
	switch mode.name {
	case "durable":
		if f.Lost != 0 {
			t.Errorf("durable commits: %d acknowledged acquisitions were lost in the crash, want 0", f.Lost)
		}
	case "async":
		bound := 3*pgWalWriterDelay + 200*time.Millisecond // the documented window, and the kill's own latency
		if f.Reach > bound {
			t.Errorf("async commit: a lost acquisition had been acknowledged %v before the crash; the documented window is 3×wal_writer_delay (%v)", f.Reach, 3*pgWalWriterDelay)
		}
		if !f.Suffix {
			t.Errorf("async commit: the lost acquisitions are not the last ones acknowledged")
		}
	case "unlogged":
		if before != 0 || f.LostBefore != f.Acked {
			t.Errorf("unlogged table: %d rows from before the crash are left, %d of %d acknowledged acquisitions survived; want an empty table",
				before, f.Acked-f.LostBefore, f.Acked)
		}
	}
}

// crashTimes are when a crashStep killed the server and how long it was
// down.
type crashTimes struct {
	killedAt time.Time
	down     time.Duration
}

// crashStep is the step that kills the server (crash), waits 300 ms and
// starts it again on its data.
func crashStep(name string, stateLoss bool, crash func(), start func() error) (stepFault, *crashTimes) {
	cc := &crashTimes{}
	return stepFault{name: name, stateLoss: stateLoss, run: func(ctx context.Context) error {
		cc.killedAt = time.Now()
		crash()
		sleepCtx(ctx, 300*time.Millisecond)
		err := start()
		cc.down = time.Since(cc.killedAt)
		return err
	}}, cc
}

// checkCrash checks what every crash must keep, whatever the durability:
// enough acknowledged acquisitions to tell, fencing tokens that never go
// back, no holder unaware of a loss, and locking working again.
func checkCrash(t *testing.T, f faultFigures, regressions int) {
	t.Helper()
	if f.Acked < 50 {
		t.Errorf("only %d acquisitions were acknowledged before the crash: too few to tell", f.Acked)
	}
	if regressions != 0 {
		t.Errorf("fencing tokens went backwards across the crash %d times", regressions)
	}
	if f.Unaware != 0 {
		t.Errorf("%d holders still think they hold a lock the crash lost", f.Unaware)
	}
	if f.Recovery < 0 {
		t.Errorf("locking never worked again after the restart")
	}
}

// errObserver feeds every error the witness sees into the secret sweep.
type errObserver struct {
	core.NopObserver
	errs *sink
}

func (o *errObserver) AcquireEnd(_ context.Context, e core.AcquireEndEvent) {
	if !errors.Is(e.Err, core.ErrNotAcquired) {
		o.errs.err(e.Err)
	}
}
func (o *errObserver) RenewEnd(_ context.Context, e core.RenewEndEvent)     { o.errs.err(e.Err) }
func (o *errObserver) ReleaseEnd(_ context.Context, e core.ReleaseEndEvent) { o.errs.err(e.Err) }

// pgRestartWaiters restarts the server while three Lockers wait for a key
// held by a fourth: the waiters' LISTEN connections break, they must
// subscribe again, and each must wake on a release by notification, well
// before any poll (their backoff is longer than the test; the polls that
// keep their places in line, every third of a place's life, may win a
// release they were sent before).
func pgRestartWaiters(t *testing.T, srv *pgServer) {
	ctx := context.Background()
	table := "dislock_restart_waiters"
	key := runPrefix("pg-restart") + "k"
	adminPool := privatePool(t, srv, "dislock-chaos-admin", 2)
	defer adminPool.Close()
	if _, err := pg.NewBackend(ctx, adminPool, pg.WithTable(table), pg.WithAutoMigrate()); err != nil {
		t.Fatal(err)
	}
	lease := []core.Option{core.TTL(10 * time.Second), core.RenewInterval(500 * time.Millisecond), core.RenewDeadline(6 * time.Second),
		core.Backoff(30*time.Second, 30*time.Second)}
	logs := &sink{}
	newLocker := func(app string, obs core.Observer) (core.Locker, *parkedBackend) {
		pool := privatePool(t, srv, app, 2)
		t.Cleanup(pool.Close)
		b, err := pg.NewBackend(ctx, pool, pg.WithTable(table))
		if err != nil {
			t.Fatal(err)
		}
		pb := &parkedBackend{Backend: b}
		l, err := core.New(pb, core.WithDefaults(lease...), core.WithObserver(obs))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		return l, pb
	}
	holder, _ := newLocker("dislock-chaos-holder", &errObserver{errs: logs})
	s, err := holder.TryAcquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	const waiterApp = "dislock-chaos-waiter"
	listening := func() (int, error) {
		var n int
		err := adminPool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN %'`, waiterApp).Scan(&n)
		return n, err
	}
	waitListening := func(want int, within time.Duration) (time.Duration, error) {
		start := time.Now()
		for {
			n, err := listening()
			if err == nil && n == want {
				return time.Since(start), nil
			}
			if time.Since(start) > within {
				return 0, fmt.Errorf("%d LISTEN connections of the waiters after %v, want %d (last error: %v)", n, within, want, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	type result struct {
		i   int
		s   core.Session
		err error
		at  time.Time
	}
	const waiters = 3
	var retries atomic.Int64
	obs := make([]*testenv.Wakes, waiters)
	results := make(chan result, waiters)
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	parked := make([]*parkedBackend, waiters)
	for i := range waiters {
		obs[i] = &testenv.Wakes{}
		l, pb := newLocker(waiterApp, core.Observers(obs[i], &errObserver{errs: logs}))
		parked[i] = pb
		go func() {
			// A store error ends a waiting Acquire (the server going
			// away, say); the waiter then waits again, as an
			// application's loop does.
			for {
				s, err := l.Acquire(wctx, key)
				if err != nil && wctx.Err() == nil {
					retries.Add(1)
					sleepCtx(wctx, 100*time.Millisecond)
					continue
				}
				results <- result{i: i, s: s, err: err, at: time.Now()}
				return
			}
		}()
	}
	if _, err := waitListening(waiters, 10*time.Second); err != nil {
		t.Fatal(err)
	}

	restartAt := time.Now()
	srv.stop()
	if err := srv.start(); err != nil {
		t.Fatal(err)
	}
	down := time.Since(restartAt)
	resub, err := waitListening(waiters, 20*time.Second)
	if err != nil {
		t.Fatalf("the waiters did not subscribe again after the restart: %v", err)
	}
	if err := s.Err(); err != nil {
		t.Fatalf("the holder lost its lock over a %v restart (renew deadline 6s): %v", down, err)
	}
	// Every waiter is back in its wait: its last attempt (after the
	// restart's failures) was answered busy.
	for deadline := time.Now().Add(20 * time.Second); ; {
		all := true
		for _, pb := range parked {
			all = all && pb.parkedSince(restartAt)
		}
		if all {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiters did not wait again after the restart")
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case r := <-results:
		t.Fatalf("waiter %d returned before any release: %v", r.i, r.err)
	default:
	}

	// Each release wakes the next waiter by notification.
	var wakes []time.Duration
	polls := 0 // waiters whose place-keeping poll, sent before the release returned, won the key
	release := s
	for range waiters {
		releasedAt := time.Now()
		if err := releaseRetry(ctx, release); err != nil {
			t.Fatalf("release: %v", err)
		}
		releasedTo := time.Now()
		var r result
		select {
		case r = <-results:
		case <-time.After(10 * time.Second):
			t.Fatalf("no waiter woke within 10s of a release after the restart")
		}
		if r.err != nil {
			t.Fatalf("waiter %d: %v", r.i, r.err)
		}
		wake := r.at.Sub(releasedAt)
		wakes = append(wakes, wake)
		// A waiter polls every third of its place's life to keep its
		// place; a poll that was already on its way when the release
		// returned can win the key before the notification wakes the
		// waiter. Only a poll sent after the release says that the
		// notification did not come.
		if got := obs[r.i].Of(key); got != core.WakeNotify {
			if after, late := parked[r.i].sentSince(releasedTo); late {
				t.Errorf("waiter %d was woken by %q sent %v after the release returned, want a notification", r.i, got, after)
			} else {
				polls++
			}
		}
		if wake > 2*time.Second {
			t.Errorf("waiter %d took %v after the release", r.i, wake)
		}
		release = r.s
	}
	if err := releaseRetry(ctx, release); err != nil {
		t.Fatal(err)
	}
	var ws []string
	for _, d := range wakes {
		ws = append(ws, d.Round(time.Millisecond).String())
	}
	figure(t, "PostgreSQL restart with %d LISTEN waiters: server down %v, waiters subscribed again %v after it was back, woken %s after each release (by notification; %d by a poll already on its way), holder kept its lock; %d waiting Acquire calls ended on the restart's errors and were called again",
		waiters, down.Round(time.Millisecond), resub.Round(time.Millisecond), strings.Join(ws, ", "), polls, retries.Load())
	checkNoSecret(t, "pg restart", logs.String())
}

// releaseRetry releases s, retrying a few times: the first try after a
// restart may get a pooled connection the restart closed (57P01), and a
// release is safe to repeat.
func releaseRetry(ctx context.Context, s core.Session) error {
	var err error
	for range 3 {
		if err = s.Release(ctx); err == nil {
			return nil
		}
	}
	return err
}

// parkedBackend tells whether the last acquire attempt through it was
// answered busy and no other is in flight: its Locker's Acquire is waiting.
type parkedBackend struct {
	*pg.Backend
	mu       sync.Mutex
	inflight int
	busyAt   time.Time // when the last attempt was answered busy; zero after a failure
	sentAt   time.Time // when the last attempt was sent
}

func (b *parkedBackend) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	b.mu.Lock()
	b.inflight++
	b.sentAt = time.Now()
	b.mu.Unlock()
	l, err := b.Backend.TryAcquire(ctx, req)
	b.mu.Lock()
	b.inflight--
	b.busyAt = time.Time{}
	if errors.Is(err, core.ErrNotAcquired) {
		b.busyAt = time.Now()
	}
	b.mu.Unlock()
	return l, err
}

// sentSince says how long after t the last attempt was sent, and whether
// it was sent at t or later.
func (b *parkedBackend) sentSince(t time.Time) (time.Duration, bool) {
	b.mu.Lock()
	d := b.sentAt.Sub(t)
	b.mu.Unlock()
	return d, d >= 0
}

func (b *parkedBackend) parkedSince(t time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.inflight == 0 && b.busyAt.After(t)
}
