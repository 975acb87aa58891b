package pg_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/benchtest"
	"github.com/dislock/dislock/pg"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Every benchmark measures a SELECT 1 round trip on the same pool and at
// the same concurrency in the same run, and reports its own cost as a ratio
// to it (x_select1: time per operation ÷ time per SELECT 1; for the hot key,
// attempts_per_select1: attempts per second ÷ SELECT 1 per second).

// select1 returns the mean time of one SELECT 1 with par goroutines sharing
// pool, measured over about 500ms.
func select1(b *testing.B, pool *pgxpool.Pool, par int) time.Duration {
	b.Helper()
	op := selectOne(pool)
	for range 20 { // warm the pool's connections
		_ = op()
	}
	return time.Duration(float64(time.Second) / benchtest.Rate(b, par, 500*time.Millisecond, op))
}

// selectOne is one SELECT 1 on pool.
func selectOne(pool *pgxpool.Pool) func() error {
	return func() error {
		var one int
		return pool.QueryRow(context.Background(), "SELECT 1").Scan(&one)
	}
}

// reportWaits sorts waits and reports their median and 90th percentile
// (p50_ms, p90_ms); it returns the median.
func reportWaits(b *testing.B, waits []time.Duration) time.Duration {
	slices.Sort(waits)
	p50 := waits[len(waits)/2]
	b.ReportMetric(float64(p50.Microseconds())/1000, "p50_ms")
	b.ReportMetric(float64(waits[len(waits)*9/10].Microseconds())/1000, "p90_ms")
	return p50
}

func benchPool(b *testing.B, conns int32) *pgxpool.Pool {
	return newPool(b, func(c *pgxpool.Config) { c.MaxConns, c.MinConns = conns, conns })
}

func benchTable(b *testing.B, pool *pgxpool.Pool) string {
	return newTable(b, pool)
}

// benchLocker returns a Locker on pool and table with opts, closed when
// the benchmark ends.
func benchLocker(b *testing.B, pool *pgxpool.Pool, table string, opts ...pg.Option) *core.Client {
	b.Helper()
	l, err := pg.New(context.Background(), pool, append([]pg.Option{pg.WithTable(table)}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return l
}

func reportRatio(b *testing.B, base time.Duration) {
	per := b.Elapsed() / time.Duration(b.N)
	b.ReportMetric(float64(per)/float64(base), "x_select1")
	b.ReportMetric(float64(base.Microseconds()), "select1_µs")
}

func BenchmarkSelect1(b *testing.B) {
	benchtest.Loop(b, selectOne(benchPool(b, 4)))
}

// commitModes are the commit modes the benchmarks compare: durable (the
// default) and WithAsyncCommit.
var commitModes = []struct {
	name string
	opts []pg.Option
}{{"durable", nil}, {"async", []pg.Option{pg.WithAsyncCommit()}}}

// Uncontended TryAcquire + Release through the Locker, durable (default)
// and with WithAsyncCommit.
func BenchmarkTryAcquireRelease(b *testing.B) {
	for _, mode := range commitModes {
		b.Run(mode.name, func(b *testing.B) {
			pool := benchPool(b, 4)
			l := benchLocker(b, pool, benchTable(b, pool), mode.opts...)
			op := benchtest.AcquireRelease(l, "k")
			base := select1(b, pool, 1)
			b.ResetTimer()
			for b.Loop() {
				if err := op(); err != nil {
					b.Fatal(err)
				}
			}
			reportRatio(b, base)
		})
	}
}

// The plain TTL-row lock people write by hand: an upsert guarded only by the
// ON CONFLICT WHERE, then a delete.
const (
	naiveAcquire = `INSERT INTO %s AS l (key, owner, holder, acquired_at, expire_at)
VALUES ($1, $2, $3, now(), now() + interval '30 seconds')
ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, holder = excluded.holder,
	token = excluded.token, acquired_at = excluded.acquired_at, expire_at = excluded.expire_at
WHERE l.expire_at <= now() RETURNING token`
	naiveRelease = `DELETE FROM %s WHERE key = $1 AND holder = $2`
)

func BenchmarkPlainTTLRow(b *testing.B) {
	pool := benchPool(b, 4)
	table := benchTable(b, pool)
	ident := pgx.Identifier{table}.Sanitize()
	acq, rel := fmt.Sprintf(naiveAcquire, ident), fmt.Sprintf(naiveRelease, ident)
	ctx := context.Background()
	base := select1(b, pool, 1)
	b.ResetTimer()
	for b.Loop() {
		tok := rand.Text()
		var token int64
		if err := pool.QueryRow(ctx, acq, "k", "me", tok).Scan(&token); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, rel, "k", tok); err != nil {
			b.Fatal(err)
		}
	}
	reportRatio(b, base)
}

// Hot key: 64 goroutines try-lock one key (and release when they win). The
// metric is attempts per second ÷ SELECT 1 per second at the same
// concurrency on the same pool. "naive" is the unguarded upsert.
func BenchmarkHotKey64(b *testing.B) {
	for _, mode := range []string{"dislock", "held", "naive"} {
		b.Run(mode, func(b *testing.B) {
			pool := benchPool(b, 16)
			table := benchTable(b, pool)
			be, err := pg.NewBackend(context.Background(), pool, pg.WithTable(table))
			if err != nil {
				b.Fatal(err)
			}
			ident := pgx.Identifier{table}.Sanitize()
			acq, rel := fmt.Sprintf(naiveAcquire, ident), fmt.Sprintf(naiveRelease, ident)
			ctx := context.Background()
			base := select1(b, pool, 64)
			if mode == "held" {
				// A holder keeps the key for the whole run: every attempt is
				// a busy answer, the read-only path.
				if _, err := be.TryAcquire(ctx, core.AcquireRequest{Key: "hot", Owner: "holder", OwnerToken: "holder", TTL: time.Hour}); err != nil {
					b.Fatal(err)
				}
			}
			// try claims the key for tok, reporting whether it won; release
			// gives a won claim up.
			try := func(tok string) (bool, error) {
				_, err := be.TryAcquire(ctx, core.AcquireRequest{Key: "hot", Owner: "me", OwnerToken: tok, TTL: 30 * time.Second})
				if errors.Is(err, core.ErrNotAcquired) {
					return false, nil
				}
				return err == nil, err
			}
			release := func(tok string) error {
				return be.Release(ctx, core.ReleaseRequest{Key: "hot", OwnerToken: tok})
			}
			if mode == "naive" {
				try = func(tok string) (bool, error) {
					var token int64
					err := pool.QueryRow(ctx, acq, "hot", "me", tok).Scan(&token)
					if errors.Is(err, pgx.ErrNoRows) {
						return false, nil
					}
					return err == nil, err
				}
				release = func(tok string) error {
					_, err := pool.Exec(ctx, rel, "hot", tok)
					return err
				}
			}
			var wins atomic.Int64
			n := runtime.GOMAXPROCS(0)
			b.SetParallelism((64 + n - 1) / n) // goroutines = parallelism × GOMAXPROCS
			b.ResetTimer()
			b.RunParallel(func(p *testing.PB) {
				for p.Next() {
					tok := rand.Text()
					won, err := try(tok)
					if err != nil {
						b.Error(err)
						return
					}
					if !won {
						continue
					}
					wins.Add(1)
					if err := release(tok); err != nil {
						b.Error(err)
						return
					}
				}
			})
			per := b.Elapsed() / time.Duration(b.N)
			b.ReportMetric(float64(base)/float64(per), "attempts_per_select1")
			b.ReportMetric(float64(wins.Load())/b.Elapsed().Seconds(), "acquisitions/s")
		})
	}
}

// Hand-off: 16 goroutines on two Lockers (two pools, so wake-ups cross
// processes through LISTEN/NOTIFY) take turns on one key; the metric is the
// time from the start of Release to the next holder's acquisition.
func BenchmarkHandoff16(b *testing.B) {
	for _, mode := range commitModes {
		b.Run(mode.name, func(b *testing.B) { benchHandoff(b, mode.opts...) })
	}
}

func benchHandoff(b *testing.B, opts ...pg.Option) {
	admin := benchPool(b, 2)
	table := benchTable(b, admin)
	var lockers []*core.Client
	for range 2 {
		lockers = append(lockers, benchLocker(b, benchPool(b, 8), table, opts...))
	}
	base := select1(b, admin, 1)
	var (
		mu       sync.Mutex
		released time.Time // zero when no release is pending
		gaps     []time.Duration
		left     atomic.Int64
	)
	left.Store(int64(b.N))
	ctx := context.Background()
	b.ResetTimer()
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := lockers[i%2]
			for left.Load() > 0 {
				s, err := l.Acquire(ctx, "handoff", core.Backoff(50*time.Millisecond, time.Second))
				if err != nil {
					b.Error(err)
					return
				}
				now := time.Now()
				mu.Lock()
				if !released.IsZero() {
					gaps = append(gaps, now.Sub(released))
				}
				mu.Unlock()
				left.Add(-1)
				mu.Lock()
				released = time.Now()
				mu.Unlock()
				if err := s.Release(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if len(gaps) == 0 {
		return
	}
	p50 := reportWaits(b, gaps)
	b.ReportMetric(float64(p50)/float64(base), "p50_x_select1")
}

// Hand-off on a fresh key: 16 goroutines call Acquire at once on a key never
// used before, each holds it ~1 ms and releases it; a new key every round
// (b.N rounds). One Locker (16 waiters in one process) and four Lockers
// (four processes of four waiters; fewer pools than waiters, to stay within
// the server's connection limit when other tests run beside). The
// metric is each Acquire's wait, from the round's start; a waiter that was
// told no turn waits for its fallback poll (a third of the queue TTL).
func BenchmarkHandoffFreshKey(b *testing.B) {
	for _, n := range []int{1, 4} {
		b.Run(fmt.Sprintf("lockers=%d", n), func(b *testing.B) {
			admin := benchPool(b, 2)
			table := benchTable(b, admin)
			var lockers []*core.Client
			for range n {
				l, err := pg.New(context.Background(), benchPool(b, int32(8/n)), pg.WithTable(table))
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
				lockers = append(lockers, l)
			}
			ctx := context.Background()
			var waits []time.Duration
			var mu sync.Mutex
			b.ResetTimer()
			for r := range b.N {
				key := fmt.Sprintf("fresh-%d", r)
				start := time.Now()
				var wg sync.WaitGroup
				for i := range 16 {
					wg.Go(func() {
						s, err := lockers[i%n].Acquire(ctx, key)
						if err != nil {
							b.Error(err)
							return
						}
						mu.Lock()
						waits = append(waits, time.Since(start))
						mu.Unlock()
						time.Sleep(time.Millisecond) // the work under the lock
						if err := s.Release(ctx); err != nil {
							b.Error(err)
						}
					})
				}
				wg.Wait()
			}
			b.StopTimer()
			reportWaits(b, waits)
		})
	}
}

// countingBackend counts Renew calls and renewed items.
type countingBackend struct {
	*pg.Backend
	calls, items atomic.Int64
}

func (c *countingBackend) Renew(ctx context.Context, reqs []core.RenewRequest) ([]error, error) {
	c.calls.Add(1)
	c.items.Add(int64(len(reqs)))
	return c.Backend.Renew(ctx, reqs)
}

// Holding 1,000 leases on one Locker: renew statements (write transactions)
// per renew interval, and committed transactions on the database per
// interval (pg_stat_database, which includes anything else running there).
func BenchmarkHold1000(b *testing.B) {
	benchHold(b, 1000, "renew_stmts/interval", "leases_renewed/interval", func(ctx context.Context, l core.Locker, i int, ttl time.Duration) error {
		_, err := l.TryAcquire(ctx, fmt.Sprintf("lease-%d", i), core.TTL(ttl))
		return err
	})
}

// benchHold claims n leases on one Locker with claim (i from 0 to n-1, by
// 8 goroutines; TTL 3s) and reports, per renew interval over three of them,
// the Renew calls (metric calls), the leases they renewed (metric items)
// and the database's committed transactions.
func benchHold(b *testing.B, n int, calls, items string, claim func(ctx context.Context, l core.Locker, i int, ttl time.Duration) error) {
	// One set of n held leases for the whole benchmark, however many
	// windows it measures (a pool and a Locker per window would open
	// connections by the hundred under -benchtime Nx).
	pool := benchPool(b, 8)
	table := benchTable(b, pool)
	be, err := pg.NewBackend(context.Background(), pool, pg.WithTable(table))
	if err != nil {
		b.Fatal(err)
	}
	cb := &countingBackend{Backend: be}
	l, err := core.New(cb)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := l.Close(); err != nil {
			b.Fatal(err)
		}
	}()
	const ttl = 3 * time.Second
	interval := ttl / 3
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				if err := claim(ctx, l, i, ttl); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	xacts := func() int64 {
		var x int64
		if err := pool.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&x); err != nil {
			b.Fatal(err)
		}
		return x
	}
	// Each iteration is a measuring window of three intervals.
	const rounds = 3
	var c, it, x int64
	windows := 0
	for b.Loop() {
		calls0, items0, x0 := cb.calls.Load(), cb.items.Load(), xacts()
		time.Sleep(rounds * interval) // a measuring window, not synchronisation
		c += cb.calls.Load() - calls0
		it += cb.items.Load() - items0
		x += xacts() - x0 - 1
		windows++
	}
	per := float64(rounds * windows)
	b.ReportMetric(float64(c)/per, calls)
	b.ReportMetric(float64(it)/per, items)
	b.ReportMetric(float64(x)/per, "db_commits/interval")
}
