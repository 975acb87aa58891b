package chaos

import (
	"context"
	"errors"
	"flag"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

var (
	flagLong = flag.Bool("chaos.long", false, "run the long tier (seed sweep, longer fault phases, holder pause and kill); also DISLOCK_CHAOS_LONG=1")
	flagSeed = flag.Uint64("chaos.seed", 0, "seed of the first run (0: derived from the clock); a failure prints the seed to pass here")
	flagOut  = flag.String("chaos.out", "", "directory for the JSON history of a failed run (default: the system's temporary directory)")
)

func longTier() bool { return *flagLong || os.Getenv("DISLOCK_CHAOS_LONG") == "1" }

func firstSeed() uint64 {
	if *flagSeed != 0 {
		return *flagSeed
	}
	return uint64(time.Now().UnixNano())
}

// sentinelPW is put into every URL the suite builds; it must never show up
// in any log, error, span, metric or history.
const sentinelPW = "S3NTINEL-PW"

// timing is the lease timing of a run's sessions.
type timing struct {
	ttl, interval, deadline time.Duration
}

var shortTiming = timing{ttl: 1500 * time.Millisecond, interval: 500 * time.Millisecond, deadline: time.Second}

func (tm timing) options() []core.Option {
	return []core.Option{core.TTL(tm.ttl), core.RenewInterval(tm.interval), core.RenewDeadline(tm.deadline),
		core.Backoff(10*time.Millisecond, 200*time.Millisecond)}
}

// runConfig sizes one chaos run.
type runConfig struct {
	seed       uint64
	contenders int
	keys       int
	faultPhase time.Duration
	// limit > 1 makes the keys semaphores of that many permits
	// (core.Limit): the checker then allows up to limit holds of a key at
	// once, and the steps skip the fenced register, which assumes mutual
	// exclusion.
	limit int
	// firstFault, when set, names the fault the fault phase starts with
	// (then the seed chooses, as always).
	firstFault string
	timing
}

func shortRun(seed uint64) runConfig {
	return runConfig{seed: seed, contenders: 4, keys: 2, faultPhase: 18 * time.Second, timing: shortTiming}
}

// semaphoreRun is the short tier's semaphore run: five contenders on two
// keys of two permits each, so that a key is often full with someone
// waiting, through the same faults as the mutex runs in a shorter fault
// phase. It starts with the keys deleted behind their holders' backs, so
// that every run has the state loss that lets the store hand out permits
// still in use.
func semaphoreRun(seed uint64) runConfig {
	return runConfig{seed: seed, contenders: 5, keys: 2, limit: 2, faultPhase: 9 * time.Second, timing: shortTiming,
		firstFault: "delete-locks"}
}

// acquireOptions are the options of every acquisition of the run.
func (c runConfig) acquireOptions() []core.Option {
	if c.limit > 1 {
		return []core.Option{core.Limit(c.limit)}
	}
	return nil
}

// faultDef is one kind of fault. run applies it, keeps it for a while (never
// past ctx) and heals it before returning.
type faultDef struct {
	name      string
	stateLoss bool
	run       func(ctx context.Context, rng *mrand.Rand) error
}

// backendEnv is what a run needs from one backend.
type backendEnv struct {
	name  string
	proxy *Proxy
	// newLocker builds a Locker of its own (own pool or client) through the
	// proxy; the returned function closes the Locker and its pool.
	newLocker func(ctx context.Context, opts ...core.ClientOption) (core.Locker, func() error, error)
	// admin inspects locks directly, not through the proxy.
	admin core.Admin
	// deleteKeys removes locks behind their holders' backs and reports, per
	// key, what the store says it removed (nil: the store reports nothing,
	// and the checker judges the fault by its time window alone).
	deleteKeys func(ctx context.Context, keys []string) ([]removal, error)
	// probe makes one round trip through the proxy.
	probe func(ctx context.Context) error
	// faults specific to this backend (server side).
	faults []faultDef
	// reg is the fenced register (PostgreSQL, direct); nil when unavailable.
	reg *register
	// keyPrefix makes this run's keys unique.
	keyPrefix string
	// limit is the run's runConfig.limit (set by runChaos after setup), for
	// deleteKeys: a semaphore's records may differ from a lock's.
	limit int
	// lost records what a state-loss fault removed (set by runChaos after
	// setup), for faults of the backend's own.
	lost  func(fault string, rm removal)
	close func()
}

// removal is what one deletion of a key's lock records removed, as the
// store reported it: the fencing tokens of the claims it removed, and, for
// a store whose every later grant gets a larger token (etcd), the
// deletion's position in the store's order (recorded as a StateLost event).
type removal struct {
	key        string
	sent, done time.Time
	tokens     []uint64
	pos        uint64
	// all: the store lost every claim (a restart without persistence,
	// the server killed between sent and done); key and tokens are empty.
	all bool
}

// sink collects every error string and log line a run produces, for the
// secret sweep.
type sink struct {
	testenv.SyncBuffer
}

func (s *sink) err(err error) {
	if err != nil {
		fmt.Fprintf(s, "%v\n%+v\n%#v\n", err, err, err)
	}
}

// recObserver records a contender's acquisitions and losses, with the times
// the engine reports them, and feeds every error into the sink.
type recObserver struct {
	core.NopObserver
	rec  *Recorder
	name string
	errs *sink
	mu   sync.Mutex
	ids  map[core.Session]int64
	tok  map[string]int64
}

func newRecObserver(rec *Recorder, name string, errs *sink) *recObserver {
	return &recObserver{rec: rec, name: name, errs: errs, ids: map[core.Session]int64{}, tok: map[string]int64{}}
}

func tokKey(key string, token uint64) string { return fmt.Sprintf("%s\x00%d", key, token) }

func (o *recObserver) AcquireEnd(_ context.Context, e core.AcquireEndEvent) {
	o.errs.err(e.Err)
	if e.Session == nil {
		return
	}
	id := o.rec.NewHold()
	o.mu.Lock()
	o.ids[e.Session] = id
	o.tok[tokKey(e.Key, e.Session.Token())] = id
	o.mu.Unlock()
	o.rec.Add(Event{Kind: AcquireOK, Contender: o.name, Key: e.Key, Hold: id, Token: e.Session.Token(),
		Deadline: o.rec.Since(e.Session.Deadline())})
}

func (o *recObserver) RenewEnd(_ context.Context, e core.RenewEndEvent)     { o.errs.err(e.Err) }
func (o *recObserver) ReleaseEnd(_ context.Context, e core.ReleaseEndEvent) { o.errs.err(e.Err) }

func (o *recObserver) Lost(_ context.Context, e core.LostEvent) {
	o.errs.err(e.Err)
	o.mu.Lock()
	id := o.tok[tokKey(e.Key, e.Token)]
	o.mu.Unlock()
	o.rec.Add(Event{Kind: Lost, Contender: o.name, Key: e.Key, Hold: id, Token: e.Token, Err: errString(e.Err)})
}

func (o *recObserver) hold(s core.Session) int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.ids[s]
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// register is the fenced resource: one row per key in PostgreSQL, written
// on a direct connection (not through the proxy) only with a token at least
// as large as the last one it accepted. The table is unlogged: a write
// waits for no WAL flush, so that a disk busy with other tests' commits
// does not stretch a critical step (see stopSlack) by hundreds of
// milliseconds; the shared server it lives on is never crashed.
type register struct {
	pool  *pgxpool.Pool
	table string
}

func newRegister(ctx context.Context, pool *pgxpool.Pool, keys []string) (*register, error) {
	r := &register{pool: pool, table: "dislock_chaos_register"}
	if _, err := pool.Exec(ctx, `CREATE UNLOGGED TABLE IF NOT EXISTS dislock_chaos_register (
	id text PRIMARY KEY, token bigint NOT NULL, value bigint NOT NULL)`); err != nil {
		return nil, fmt.Errorf("create register: %w", err)
	}
	// A table an earlier version made logged becomes unlogged.
	if _, err := pool.Exec(ctx, `DO $$ BEGIN
	IF (SELECT relpersistence FROM pg_class WHERE oid = 'dislock_chaos_register'::regclass) = 'p' THEN
		ALTER TABLE dislock_chaos_register SET UNLOGGED;
	END IF; END $$`); err != nil {
		return nil, fmt.Errorf("make the register unlogged: %w", err)
	}
	for _, k := range keys {
		if _, err := pool.Exec(ctx, `INSERT INTO dislock_chaos_register (id, token, value) VALUES ($1, 0, 0) ON CONFLICT (id) DO NOTHING`, k); err != nil {
			return nil, fmt.Errorf("init register: %w", err)
		}
	}
	return r, nil
}

// write stores a write under token; seq is the register's write count
// after it when accepted.
func (r *register) write(ctx context.Context, key string, token uint64) (accepted bool, seq int64, err error) {
	rows, err := r.pool.Query(ctx, `UPDATE dislock_chaos_register SET token = $2, value = value + 1 WHERE id = $1 AND token <= $2 RETURNING value`, key, int64(token))
	if err != nil {
		return false, 0, err
	}
	defer rows.Close()
	if rows.Next() {
		if err := rows.Scan(&seq); err != nil {
			return false, 0, err
		}
		accepted = true
	}
	return accepted, seq, rows.Err()
}

// run is one chaos run against one backend.
type run struct {
	t        *testing.T
	cfg      runConfig
	env      *backendEnv
	rec      *Recorder
	errs     *sink
	keys     []string
	counters map[string]*atomic.Int64
	ctx      context.Context
}

type contender struct {
	name string
	l    core.Locker
	obs  *recObserver
	rng  *mrand.Rand
	stop func() error
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func between(rng *mrand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
}

// iteration is one acquire → critical section → release of key. It reports
// whether the lock was acquired.
func (r *run) iteration(c *contender, key string, timeout, maxHold time.Duration) bool {
	r.rec.Add(Event{Kind: AcquireStart, Contender: c.name, Key: key})
	actx, cancel := context.WithTimeout(r.ctx, timeout)
	s, err := c.l.Acquire(actx, key, r.cfg.acquireOptions()...)
	cancel()
	if err != nil {
		r.errs.err(err)
		if errors.Is(err, core.ErrLimitMismatch) || errors.Is(err, core.ErrUnsupported) {
			// Every contender asks for the same limit of keys of its own.
			r.t.Errorf("%s: acquire %s: %v", c.name, key, err)
		}
		kind := AcquireUnknown
		if errors.Is(err, core.ErrNotAcquired) {
			kind = AcquireBusy
		}
		r.rec.Add(Event{Kind: kind, Contender: c.name, Key: key, Err: err.Error()})
		return false
	}
	id := c.obs.hold(s)
	// Hold for a moment, or (maxHold up to a TTL) long enough for renewals
	// and faults to happen mid-hold.
	holdFor := between(c.rng, 10*time.Millisecond, 100*time.Millisecond)
	if c.rng.IntN(2) == 0 {
		holdFor = between(c.rng, 10*time.Millisecond, maxHold)
	}
	r.work(c, s, id, key, min(holdFor, maxHold))
	r.finish(c, s, id, key)
	return true
}

// work runs critical steps on key for holdFor, or until the session is no
// longer valid, and records when the work stopped.
func (r *run) work(c *contender, s core.Session, id int64, key string, holdFor time.Duration) {
	for until := time.Now().Add(holdFor); time.Now().Before(until); {
		if !r.critical(c, s, id, key) {
			break
		}
	}
	r.rec.Add(Event{Kind: WorkStopped, Contender: c.name, Key: key, Hold: id, Token: s.Token()})
}

// finish checks that a passed deadline was signalled, then releases the
// session, lost or not: a lost session's Release tells the store the work
// has stopped (as Do does after its function returns).
func (r *run) finish(c *contender, s core.Session, id int64, key string) {
	if s.Err() == nil && !time.Now().Before(s.Deadline()) {
		// The deadline passed: the engine must say so at once.
		select {
		case <-s.Done():
		case <-time.After(lossSlack):
			if s.Err() == nil {
				r.rec.Add(Event{Kind: LossMissing, Contender: c.name, Key: key, Hold: id, Token: s.Token()})
			}
		}
	}
	r.rec.Add(Event{Kind: ReleaseStart, Contender: c.name, Key: key, Hold: id, Token: s.Token()})
	err := s.Release(context.Background())
	if errors.Is(err, core.ErrLeaseLost) {
		err = nil // the store refused: the key is gone already
	}
	r.errs.err(err)
	r.rec.Add(Event{Kind: ReleaseEnd, Contender: c.name, Key: key, Hold: id, Token: s.Token(), Err: errString(err)})
	r.rec.Add(Event{Kind: HoldEnd, Contender: c.name, Key: key, Hold: id, Token: s.Token(), Deadline: r.rec.Since(s.Deadline())})
}

// stopSlack is how long after its session stopped being valid the workload
// may take to stop: one critical step (at most 40ms of work and a fenced
// write on a direct connection to an unlogged table) under the race
// detector on a busy machine.
// It is well inside the margin TTL - RenewDeadline (500ms).
const stopSlack = 300 * time.Millisecond

// lossSlack is how late after its local deadline a loss may be signalled:
// the renewer's timer under the race detector on a busy 2-core machine.
const lossSlack = 400 * time.Millisecond

// critical is one step of the critical section: the unfenced
// read-sleep-write counter, then a fenced register write. A step starts only
// while the session is held and its local deadline has not passed; once
// begun, the counter update runs to its end, as real work does when its
// context is cancelled, so after a loss the work stops within one step.
func (r *run) critical(c *contender, s core.Session, id int64, key string) bool {
	valid := func(now time.Time) bool { return s.Err() == nil && now.Before(s.Deadline()) }
	if !valid(time.Now()) {
		return false
	}
	ctr := r.counters[key]
	v := ctr.Load()
	r.rec.Add(Event{Kind: CounterRead, Contender: c.name, Key: key, Hold: id, Token: s.Token(), Value: v})
	sleepCtx(r.ctx, between(c.rng, 5*time.Millisecond, 40*time.Millisecond))
	now := time.Now()
	ctr.Store(v + 1)
	r.rec.Add(Event{At: r.rec.Since(now), Kind: CounterWrite, Contender: c.name, Key: key, Hold: id, Token: s.Token(), Read: v, Value: v + 1})
	if r.env.reg != nil && r.cfg.limit <= 1 {
		now = time.Now()
		if !valid(now) {
			return false
		}
		wctx, cancel := context.WithTimeout(r.ctx, 2*time.Second)
		acc, seq, err := r.env.reg.write(wctx, key, s.Token())
		cancel()
		r.rec.Add(Event{Kind: FencedWrite, Contender: c.name, Key: key, Hold: id, Token: s.Token(),
			Sent: r.rec.Since(now), Accepted: acc, Value: seq, Err: errString(err)})
		if err != nil {
			r.t.Errorf("fenced write on the direct connection: %v", err)
		}
	}
	return true
}

// proxyFaults are the network faults every backend gets.
func proxyFaults(px *Proxy, tm timing) []faultDef {
	hold := func(ctx context.Context, rng *mrand.Rand, lo, hi time.Duration) {
		sleepCtx(ctx, between(rng, lo, hi))
	}
	return []faultDef{
		{name: "cut", run: func(ctx context.Context, rng *mrand.Rand) error {
			px.Cut()
			hold(ctx, rng, 300*time.Millisecond, 2500*time.Millisecond)
			return px.Restore()
		}},
		{name: "drop-replies", run: func(ctx context.Context, rng *mrand.Rand) error {
			rm, err := px.DropReplies()
			if err != nil {
				return err
			}
			hold(ctx, rng, 300*time.Millisecond, 2500*time.Millisecond)
			rm()
			return nil
		}},
		{name: "latency-above-ttl", run: func(ctx context.Context, rng *mrand.Rand) error {
			rm, err := px.Latency(int((tm.ttl + between(rng, 100*time.Millisecond, 700*time.Millisecond)) / time.Millisecond))
			if err != nil {
				return err
			}
			hold(ctx, rng, time.Second, 3*time.Second)
			rm()
			return nil
		}},
		{name: "reset-peer", run: func(ctx context.Context, rng *mrand.Rand) error {
			rm, err := px.ResetPeer()
			if err != nil {
				return err
			}
			hold(ctx, rng, 200*time.Millisecond, time.Second)
			rm()
			return nil
		}},
	}
}

// killRestart is the fault that kills a server, and starts it again 0.1 to
// 1 s later; stateLoss: the kill loses what the server held.
func killRestart(name string, stateLoss bool, kill func(), restart func() error) faultDef {
	return faultDef{name: name, stateLoss: stateLoss, run: func(ctx context.Context, rng *mrand.Rand) error {
		kill()
		sleepCtx(ctx, between(rng, 100*time.Millisecond, time.Second))
		return restart()
	}}
}

// runChaos runs contenders against env's backend through its proxy while
// faults come and go, then heals everything, checks the history and the
// goroutines, and returns the report.
func runChaos(t *testing.T, cfg runConfig, setup func(t *testing.T, h *Harness, keys []string, prefix string) *backendEnv) Report {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	rng := mrand.New(mrand.NewPCG(cfg.seed, 0x5eed))
	prefix := fmt.Sprintf("chaos-%d-", cfg.seed)
	if cfg.limit > 1 {
		prefix = fmt.Sprintf("chaos-sem%d-%d-", cfg.limit, cfg.seed)
	}
	keys := make([]string, cfg.keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("%shot-%d", prefix, i)
	}
	logs := &sink{}
	h := NewHarness(logs)
	env := setup(t, h, keys, prefix)
	env.limit = cfg.limit
	r, cancel := newRun(t, cfg, env, keys, NewRecorder(cfg.seed), logs)
	defer cancel()
	env.lost = func(fault string, rm removal) {
		r.rec.Add(Event{At: r.rec.Since(rm.done), Sent: r.rec.Since(rm.sent), Kind: StateLost, Key: rm.key,
			Fault: fault, Tokens: rm.tokens, Pos: rm.pos, All: rm.all})
	}
	kind := "mutex"
	if cfg.limit > 1 {
		kind = fmt.Sprintf("semaphore of %d permits", cfg.limit)
	}
	t.Logf("%s: seed %d (rerun with -chaos.seed=%d), %d contenders, %d keys (%s), faults for %v",
		env.name, cfg.seed, cfg.seed, cfg.contenders, cfg.keys, kind, cfg.faultPhase)

	cr := r.startCrowd(cancel)

	// Fault phase: one fault at a time, with healthy gaps.
	var faults []faultDef
	if env.proxy != nil {
		faults = proxyFaults(env.proxy, cfg.timing)
	}
	faults = append(faults, env.faults...)
	faults = append(faults, faultDef{name: "delete-locks", stateLoss: true, run: func(ctx context.Context, _ *mrand.Rand) error {
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		rms, err := env.deleteKeys(dctx, keys)
		for _, rm := range rms {
			env.lost("delete-locks", rm)
		}
		return err
	}})
	end := time.Now().Add(cfg.faultPhase)
	counts := map[string]int{}
	for time.Now().Before(end) {
		sleepCtx(r.ctx, between(rng, 300*time.Millisecond, 1200*time.Millisecond))
		f := faults[rng.IntN(len(faults))]
		if len(counts) == 0 && cfg.firstFault != "" {
			for _, d := range faults {
				if d.name == cfg.firstFault {
					f = d
				}
			}
		}
		counts[f.name]++
		r.rec.Add(Event{Kind: FaultStart, Fault: f.name, StateLoss: f.stateLoss})
		fctx, fcancel := context.WithTimeout(r.ctx, 5*time.Second)
		err := f.run(fctx, rng)
		fcancel()
		r.rec.Add(Event{Kind: FaultEnd, Fault: f.name})
		if err != nil {
			t.Errorf("fault %s: %v", f.name, err)
		}
	}
	r.awaitHealed(10 * time.Second)
	t.Logf("%s: faults applied: %v", env.name, counts)
	sleepCtx(r.ctx, cfg.ttl)
	cr.stop()

	hist, rep := r.check()
	removals, removed := 0, 0
	for _, e := range hist.Events {
		if e.Kind == StateLost {
			removals++
			removed += len(e.Tokens)
		}
	}
	if removals > 0 {
		t.Logf("%s: state-loss faults recorded what they removed: %d records, %d claims", env.name, removals, removed)
	}
	if len(rep.Excused) > 0 {
		var b strings.Builder
		for _, v := range rep.Excused[:min(3, len(rep.Excused))] {
			fmt.Fprintf(&b, "\n  %s on key %q: %s", v.Rule, v.Key, v.Detail)
		}
		t.Logf("%s: %d overlaps and lost updates allowed by a state-loss fault, such as:%s", env.name, len(rep.Excused), b.String())
	}
	if cfg.limit > 1 {
		most := 0
		for _, n := range rep.MaxHolds {
			most = max(most, n)
		}
		if most < cfg.limit {
			t.Errorf("%s: no key ever had %d holders at once (at most %d): the semaphore was not exercised", env.name, cfg.limit, most)
		}
	}

	env.close()
	h.Close()
	if err := findLeaks(ignore); err != nil {
		t.Errorf("%s: goroutines still running after the run (seed %d): %v", env.name, cfg.seed, err)
	}
	checkNoSecret(t, env.name+" run", logs.String(), historyText(hist))
	return rep
}

// crowd is the contenders of a run, each in its own loop of iterations on
// random keys until stop.
type crowd struct {
	r        *run
	cancel   context.CancelFunc
	cs       []*contender
	stopLoop chan struct{}
	wg       sync.WaitGroup
	done     []atomic.Bool
	unwatch  chan struct{}   // closed by stop: the pause watch ends
	watched  <-chan struct{} // closed when it has ended
}

// newRun is a run of cfg on env's keys, its contexts ended by cancel.
func newRun(t *testing.T, cfg runConfig, env *backendEnv, keys []string, rec *Recorder, logs *sink) (*run, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	r := &run{t: t, cfg: cfg, env: env, rec: rec, errs: logs, keys: keys,
		counters: map[string]*atomic.Int64{}, ctx: ctx}
	for _, k := range keys {
		r.counters[k] = new(atomic.Int64)
	}
	return r, cancel
}

// startCrowd builds a Locker for each of cfg.contenders contenders and
// starts their loops: acquire a random key, hold it for up to a TTL,
// release; the others wait in Acquire meanwhile.
func (r *run) startCrowd(cancel context.CancelFunc) *crowd {
	t, cfg, env := r.t, r.cfg, r.env
	t.Helper()
	cr := &crowd{r: r, cancel: cancel, stopLoop: make(chan struct{}), unwatch: make(chan struct{})}
	cr.watched = r.rec.WatchPauses(cr.unwatch)
	for i := range cfg.contenders {
		name := fmt.Sprintf("%s-c%d", env.name, i)
		obs := newRecObserver(r.rec, name, r.errs)
		l, stop, err := env.newLocker(r.ctx, core.WithDefaults(cfg.options()...), core.WithObserver(obs),
			core.WithReleaseTimeout(time.Second))
		if err != nil {
			t.Fatalf("locker %s: %v", name, err)
		}
		cr.cs = append(cr.cs, &contender{name: name, l: l, obs: obs, stop: stop,
			rng: mrand.New(mrand.NewPCG(cfg.seed, uint64(i)+1))})
	}
	cr.done = make([]atomic.Bool, len(cr.cs))
	for i, c := range cr.cs {
		cr.wg.Add(1)
		go func() {
			defer cr.wg.Done()
			defer cr.done[i].Store(true)
			for {
				select {
				case <-cr.stopLoop:
					// After the faults healed every contender must get a
					// lock again.
					for deadline := time.Now().Add(8 * cfg.ttl); time.Now().Before(deadline) && r.ctx.Err() == nil; {
						if r.iteration(c, r.keys[0], 2*cfg.ttl, 50*time.Millisecond) {
							return
						}
					}
					return
				default:
				}
				r.iteration(c, r.keys[c.rng.IntN(len(r.keys))], 2*cfg.ttl, cfg.ttl)
				sleepCtx(r.ctx, between(c.rng, 0, 20*time.Millisecond))
			}
		}()
	}
	return cr
}

// awaitHealed waits up to within for the store to answer through the proxy
// again, and records that it healed.
func (r *run) awaitHealed(within time.Duration) {
	r.t.Helper()
	for healBy := time.Now().Add(within); ; {
		pctx, pcancel := context.WithTimeout(r.ctx, time.Second)
		err := r.env.probe(pctx)
		pcancel()
		if err == nil {
			break
		}
		if time.Now().After(healBy) {
			r.t.Fatalf("%s: the store does not answer after the faults: %v", r.env.name, err)
		}
		sleepCtx(r.ctx, 100*time.Millisecond)
	}
	r.rec.Add(Event{Kind: Healed})
}

// stop ends the loops, gives the contenders 20 TTLs to get their last lock
// (those still running then are recorded as stuck), closes every Locker,
// and records the keys still held a TTL after that: once every Locker
// closed nothing may stay held.
func (cr *crowd) stop() {
	r, t, cfg := cr.r, cr.r.t, cr.r.cfg
	t.Helper()
	close(cr.stopLoop)
	finished := make(chan struct{})
	go func() { cr.wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(20 * cfg.ttl):
		for i, c := range cr.cs {
			if !cr.done[i].Load() {
				r.rec.Add(Event{Kind: Stuck, Contender: c.name})
			}
		}
		cr.cancel()
		<-finished
	}
	for _, c := range cr.cs {
		if err := c.stop(); err != nil {
			r.errs.err(err)
			t.Errorf("%s: close: %v", c.name, err)
		}
	}
	close(cr.unwatch)
	<-cr.watched
	held := map[string]core.Info{}
	for until := time.Now().Add(cfg.ttl + 500*time.Millisecond); ; {
		clear(held)
		for _, k := range r.keys {
			info, ok, err := r.env.admin.Inspect(context.Background(), k)
			if err != nil {
				t.Errorf("inspect %s: %v", k, err)
			}
			if ok {
				held[k] = info
			}
		}
		if len(held) == 0 || time.Now().After(until) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for k, info := range held {
		r.rec.Add(Event{Kind: HeldAfterRun, Key: k, Token: info.Token})
	}
}

// check checks the run's history with the checker's usual slack and fails
// the test when it breaks a rule (the history is dumped to a file) or when
// too few locks were acquired. It returns the history and the report.
func (r *run) check() (History, Report) {
	t, cfg, env := r.t, r.cfg, r.env
	t.Helper()
	hist := r.rec.History()
	rep := Check(hist, Config{RenewDeadline: cfg.deadline, Slack: 100 * time.Millisecond, LossSlack: lossSlack, StopSlack: stopSlack,
		Limit: cfg.limit})
	acquired, lost := 0, 0
	for _, e := range hist.Events {
		switch e.Kind {
		case AcquireOK:
			acquired++
		case Lost:
			lost++
		}
	}
	t.Logf("%s: %d events, %d holds, %d losses signalled, most holds of a key at once %v", env.name, len(hist.Events), acquired, lost, rep.MaxHolds)
	if !rep.OK() {
		path, err := hist.Dump(*flagOut, env.name)
		if err != nil {
			t.Logf("dump history: %v", err)
		}
		t.Errorf("%s: the history breaks the rules (seed %d, history in %s):\n%s", env.name, cfg.seed, path, rep)
	}
	if acquired < cfg.contenders*3 {
		t.Errorf("%s: only %d acquisitions: the run exercised too little", env.name, acquired)
	}
	return hist, rep
}

func historyText(h History) string {
	var b strings.Builder
	_ = h.WriteJSON(&b)
	return b.String()
}

// secretHits returns the context of every place the sentinel password
// appears in sinks.
func secretHits(sinks ...string) []string {
	var hits []string
	for i, s := range sinks {
		for off := 0; ; {
			j := strings.Index(s[off:], sentinelPW)
			if j < 0 {
				break
			}
			j += off
			lo, hi := max(0, j-200), min(len(s), j+200)
			hits = append(hits, fmt.Sprintf("sink %d: …%s…", i, s[lo:hi]))
			off = j + len(sentinelPW)
		}
	}
	return hits
}

// checkNoSecret fails when the sentinel password appears in any sink.
func checkNoSecret(t *testing.T, what string, sinks ...string) {
	t.Helper()
	for _, h := range secretHits(sinks...) {
		t.Errorf("%s: the sentinel password leaked: %s", what, h)
	}
}

// toxiproxyStuck ignores a goroutine of the fault proxy itself: a toxic
// added while its link is being torn down can be left blocked for good on a
// channel nobody reads (toxics.(*ToxicStub).Run). It holds no connection to
// a store and is the test tool's, not dislock's.
var toxiproxyStuck = goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run")

// serverWaiter ignores the goroutine that waits for a private server's
// process (deathsig.Start's, for child.launch): a server restarted during
// a run (a kill-and-restart fault) keeps running, with its waiter, until
// the test ends and stops it.
var serverWaiter = goleak.IgnoreAnyFunction("github.com/dislock/dislock/internal/deathsig.Start.func1")

// findLeaks waits up to 10s for the run's goroutines to end (closed
// connections wind down asynchronously) and reports those still running.
func findLeaks(opts ...goleak.Option) error {
	var err error
	opts = append(opts, toxiproxyStuck, serverWaiter)
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); {
		if err = goleak.Find(opts...); err == nil {
			return nil
		}
	}
	return err
}

// goleakIgnore ignores the goroutines running now.
func goleakIgnore() goleak.Option { return goleak.IgnoreCurrent() }
