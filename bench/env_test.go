package bench

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dislock/dislock/internal/benchtest"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// errBusy is returned by a contender's try when the lock is held elsewhere.
var errBusy = errors.New("bench: lock busy")

// Sizes shared by the benchmarks.
const (
	ttl         = 30 * time.Second // lease TTL where renewal plays no part
	parallelism = 64               // goroutines of the parallel benchmarks
	waiters     = 16               // goroutines on the hot key of the hand-off benchmark
	holdFor     = time.Millisecond // how long each hand-off holder keeps the lock
	pgConns     = 16               // PostgreSQL pool size, the same for every contender
	redisConns  = 64               // go-redis pool size, the same for every contender
)

// run holds what one test binary run shares: a unique name for its keys and
// tables, and the cleanups TestMain runs at the end.
var run struct {
	id       string
	mu       sync.Mutex
	cleanups []func()
	pgOnce   sync.Once
	pgURL    string // the database this run's benchmarks use
	pgNote   string
}

func TestMain(m *testing.M) {
	if dir := os.Getenv(etcdServeEnv); dir != "" {
		os.Exit(serveEtcd(dir)) // the private etcd server's process (etcdURL)
	}
	run.id = "dlbench_" + strings.ToLower(rand.Text()[:8])
	code := m.Run()
	run.mu.Lock()
	for i := len(run.cleanups) - 1; i >= 0; i-- {
		run.cleanups[i]()
	}
	run.mu.Unlock()
	os.Exit(code)
}

func atExit(f func()) {
	run.mu.Lock()
	defer run.mu.Unlock()
	run.cleanups = append(run.cleanups, f)
}

var cleanupsRegistered sync.Map // key -> struct{}

// cleanAtExit runs clean at exit, with a context that ends 30s later,
// once per key: a later call with the same key does nothing.
func cleanAtExit(key string, clean func(ctx context.Context)) {
	if _, loaded := cleanupsRegistered.LoadOrStore(key, struct{}{}); loaded {
		return
	}
	atExit(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		clean(ctx)
	})
}

// name returns a name unique to this run, for keys, prefixes and tables.
func name(parts ...string) string {
	return run.id + "_" + strings.Join(parts, "_")
}

// serverURL returns the URL of the server a benchmark uses: DISLOCK_BENCH_PG /
// DISLOCK_BENCH_REDIS when set (scripts/bench.sh points the latter at a
// private redis-server, so that INFO commandstats counts only this run),
// else the test servers of testenv.
func serverURL(tb testing.TB, store string) string {
	tb.Helper()
	env := "DISLOCK_BENCH_" + strings.ToUpper(store)
	if u := os.Getenv(env); u != "" {
		return u
	}
	if store == "pg" {
		return testenv.PG(tb)
	}
	return testenv.Redis(tb)
}

// benchPG returns the URL of a database private to this run, created on
// first use and dropped at exit, so that pg_stat_database counts only this
// run's transactions. Without the privilege to create one it falls back to
// the server's test database, and says so.
func benchPG(tb testing.TB) string {
	tb.Helper()
	base := serverURL(tb, "pg")
	run.pgOnce.Do(func() {
		run.pgURL = base
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			run.pgNote = "cannot connect: " + err.Error()
			return
		}
		defer conn.Close(ctx)
		db := pgx.Identifier{run.id}.Sanitize()
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+db); err != nil {
			run.pgNote = "no private database (" + err.Error() + "): xact_commit deltas include other clients of the test database"
			return
		}
		u, err := url.Parse(base)
		if err != nil {
			return
		}
		u.Path = "/" + run.id
		run.pgURL = u.String()
		atExit(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			conn, err := pgx.Connect(ctx, base)
			if err != nil {
				fmt.Fprintf(os.Stderr, "bench: drop database %s: %v\n", db, err)
				return
			}
			defer conn.Close(ctx)
			if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)"); err != nil {
				fmt.Fprintf(os.Stderr, "bench: drop database %s: %v\n", db, err)
			}
		})
	})
	if run.pgNote != "" {
		tb.Log(run.pgNote)
	}
	return run.pgURL
}

// newPool returns a pool of size conns on url, closed at the end of tb. A
// non-nil tracer counts its statements.
func newPool(tb testing.TB, url string, conns int32, tracer pgx.QueryTracer) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatalf("pg URL: %v", err)
	}
	cfg.MaxConns = conns
	if tracer != nil {
		cfg.ConnConfig.Tracer = tracer
	}
	pids := &backendPIDs{}
	cfg.AfterConnect = func(_ context.Context, c *pgx.Conn) error {
		pids.add(c.PgConn().PID())
		return nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("pg pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	if err := pool.Ping(context.Background()); err != nil {
		tb.Fatalf("pg ping: %v", err)
	}
	poolPIDs.Store(pool, pids)
	return pool
}

// poolPIDs holds each pool's *backendPIDs.
var poolPIDs sync.Map

// backendPIDs are the server processes of a pool's connections.
type backendPIDs struct {
	mu   sync.Mutex
	pids []uint32
}

func (p *backendPIDs) add(pid uint32) {
	p.mu.Lock()
	p.pids = append(p.pids, pid)
	p.mu.Unlock()
}

// pgServerCPU returns the CPU time (user + system) of the server processes
// that serve pool's connections, read from /proc: only when the server runs
// on this machine, and only those processes (a shared server's other
// sessions, and its background writers, are not counted). ok is false when
// /proc has none of them.
func pgServerCPU(pool *pgxpool.Pool) (d time.Duration, ok bool) {
	v, found := poolPIDs.Load(pool)
	if !found {
		return 0, false
	}
	p := v.(*backendPIDs)
	p.mu.Lock()
	pids := slices.Clone(p.pids)
	p.mu.Unlock()
	for _, pid := range pids {
		if c, found := benchtest.ProcCPU(int(pid)); found {
			d += c
			ok = true
		}
	}
	return d, ok
}

// newRedis returns a client on url with a pool of redisConns, closed at the
// end of tb. A non-nil hook counts its commands and round trips.
func newRedis(tb testing.TB, url string, hook redis.Hook) *redis.Client {
	tb.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		tb.Fatalf("redis URL: %v", err)
	}
	opt.PoolSize = redisConns
	c := redis.NewClient(opt)
	if hook != nil {
		c.AddHook(hook)
	}
	tb.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		tb.Fatalf("redis ping: %v", err)
	}
	return c
}

// deleteKeys removes this run's Redis keys (SCAN, never KEYS or FLUSHALL).
func deleteKeys(ctx context.Context, url string) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return
	}
	c := redis.NewClient(opt)
	defer c.Close()
	iter := c.Scan(ctx, 0, run.id+"*", 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 500 {
			c.Unlink(ctx, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		c.Unlink(ctx, batch...)
	}
}

// cleanRedisAtExit removes this run's keys from the server at url at exit.
func cleanRedisAtExit(url string) {
	cleanAtExit("redis "+url, func(ctx context.Context) { deleteKeys(ctx, url) })
}

// roundTrip is one raw round trip of a store.
type roundTrip func(ctx context.Context) error

func redisPing(c *redis.Client) roundTrip {
	return func(ctx context.Context) error { return c.Ping(ctx).Err() }
}

func pgSelect1(p *pgxpool.Pool) roundTrip {
	return func(ctx context.Context) error {
		var n int
		return p.QueryRow(ctx, "SELECT 1").Scan(&n)
	}
}

// meanRTT runs n sequential round trips and returns their mean.
func meanRTT(ctx context.Context, tb testing.TB, rt roundTrip, n int) time.Duration {
	tb.Helper()
	start := time.Now()
	for range n {
		if err := rt(ctx); err != nil {
			tb.Fatalf("round trip: %v", err)
		}
	}
	return time.Since(start) / time.Duration(n)
}

// parallelRun runs total calls of fn on g goroutines and returns the wall
// time. fn gets the goroutine's index.
func parallelRun(ctx context.Context, g, total int, fn func(ctx context.Context, worker int) error) (time.Duration, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, g)
	start := time.Now()
	for w := range g {
		wg.Go(func() {
			for next.Add(1) <= int64(total) {
				if err := fn(ctx, w); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), errors.Join(errs...)
}

// percentile returns the p-th percentile (0 < p <= 100) of sorted ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(float64(len(ds))*p/100+0.5) - 1
	i = max(0, min(i, len(ds)-1))
	return ds[i]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// cpuTime is this process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// commandCount counts a go-redis client's commands and round trips (a
// pipeline is one round trip).
type commandCount struct {
	cmds, trips atomic.Int64
	mu          sync.Mutex
	byName      map[string]int64 // commands sent, by name
}

func (h *commandCount) count(cmds ...redis.Cmder) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.byName == nil {
		h.byName = map[string]int64{}
	}
	for _, c := range cmds {
		h.byName[strings.ToLower(c.Name())]++
	}
}

// sent returns a copy of the counts by name.
func (h *commandCount) sent() map[string]int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := make(map[string]int64, len(h.byName))
	for k, v := range h.byName {
		m[k] = v
	}
	return m
}

func (h *commandCount) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *commandCount) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.cmds.Add(1)
		h.trips.Add(1)
		h.count(cmd)
		return next(ctx, cmd)
	}
}

func (h *commandCount) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.cmds.Add(int64(len(cmds)))
		h.trips.Add(1)
		h.count(cmds...)
		return next(ctx, cmds)
	}
}

// statementCount counts the statements a pgx pool sends.
type statementCount struct{ n atomic.Int64 }

func (t *statementCount) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	t.n.Add(1)
	return ctx
}

func (t *statementCount) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// serverCommands returns the total calls in INFO commandstats, not counting
// INFO itself.
func serverCommands(ctx context.Context, c *redis.Client) (int64, error) {
	st, err := commandStats(ctx, c)
	var total int64
	for _, v := range st {
		total += v.calls
	}
	return total, err
}

// cmdStat is one command's line of INFO commandstats.
type cmdStat struct{ calls, usec int64 }

// commandStats returns INFO commandstats by command name (lower case, as
// the client sends it), not counting INFO itself. A script's usec includes
// the commands it calls, which are counted under their own names as well.
func commandStats(ctx context.Context, c *redis.Client) (map[string]cmdStat, error) {
	s, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	stats := map[string]cmdStat{}
	for line := range strings.Lines(s) {
		line = strings.TrimSpace(line)
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" {
			continue
		}
		var st cmdStat
		for field := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(field, "=")
			if k != "calls" && k != "usec" {
				continue
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("commandstats %q: %w", line, err)
			}
			if k == "calls" {
				st.calls = n
			} else {
				st.usec = n
			}
		}
		stats[strings.TrimPrefix(name, "cmdstat_")] = st
	}
	return stats, nil
}

// serverCPU returns the Redis server's CPU time (INFO cpu, user + system).
func serverCPU(ctx context.Context, c *redis.Client) (time.Duration, error) {
	s, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var total float64
	for line := range strings.Lines(s) {
		name, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "used_cpu_user" && name != "used_cpu_sys") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu %q: %w", line, err)
		}
		total += f
	}
	return time.Duration(total * float64(time.Second)), nil
}

// commitReader reads pg_stat_database.xact_commit of its database through a
// connection of its own.
type commitReader struct {
	conn *pgx.Conn
}

func newCommitReader(tb testing.TB, url string) *commitReader {
	tb.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatalf("pg connect: %v", err)
	}
	tb.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, "SET stats_fetch_consistency = none"); err != nil {
		tb.Fatalf("pg: %v", err)
	}
	return &commitReader{conn: conn}
}

// flushSQL makes the connection publish its pending statistics when the
// statement ends. It and the reader's query run in the simple protocol: a
// statement pgx prepares first would commit one more transaction. A backend skips the flush while no table statistics are
// pending (its transaction counts then wait for a later one), hence the read
// of pg_database.
const flushSQL = "SELECT pg_stat_force_next_flush(), (SELECT count(*) FROM pg_database)"

// flushStats makes the idle connections of pool publish their pending
// statistics, and returns how many transactions that took.
func flushStats(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	conns := pool.AcquireAllIdle(ctx)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for _, c := range conns {
		if _, err := c.Exec(ctx, flushSQL, pgx.QueryExecModeSimpleProtocol); err != nil {
			return 0, err
		}
	}
	return len(conns), nil
}

// read returns the database's committed transactions. Between two reads
// the reader itself commits two (the earlier read and the later flush).
func (r *commitReader) read(ctx context.Context) (int64, error) {
	if _, err := r.conn.Exec(ctx, flushSQL, pgx.QueryExecModeSimpleProtocol); err != nil {
		return 0, err
	}
	var n int64
	err := r.conn.QueryRow(ctx, "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
		pgx.QueryExecModeSimpleProtocol).Scan(&n)
	return n, err
}
