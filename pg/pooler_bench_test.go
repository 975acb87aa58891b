package pg_test

import (
	"context"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/pg"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Hand-off behind a private PgBouncer in transaction mode, pools in exec
// mode: two Lockers (two pools, as two processes) pass one key back and
// forth; each release is made while the other Locker's Acquire is waiting
// (its first attempt was answered busy), so every hand-off crosses
// processes. The waiter is woken by a direct LISTEN connection
// (WithListenConfig) or polls (WithoutListen; the engine's backoff from
// 50ms to 1s). The metric is the time from the start of Release to the
// waiter's acquisition, as a ratio to SELECT 1 through the same pooler
// (p50_x_select1).
func BenchmarkPgBouncerHandoff(b *testing.B) {
	bn := startBouncer(b)
	b.Run("listen-direct", func(b *testing.B) {
		benchBouncerHandoff(b, bn, pg.WithListenConfig(directConfig(b)))
	})
	b.Run("poll", func(b *testing.B) { benchBouncerHandoff(b, bn, pg.WithoutListen()) })
}

func benchBouncerHandoff(b *testing.B, bn *bouncer, opts ...pg.Option) {
	admin := bouncerPool(b, bn, func(c *pgxpool.Config) { execMode(c); c.MaxConns, c.MinConns = 2, 2 })
	table := newTable(b, admin)
	ctx := context.Background()
	var (
		lockers  [2]*core.Client
		counters [2]*busyCounter
	)
	for i := range lockers {
		pool := bouncerPool(b, bn, func(c *pgxpool.Config) { execMode(c); c.MaxConns, c.MinConns = 4, 4 })
		be, err := pg.NewBackend(ctx, pool, append([]pg.Option{pg.WithTable(table)}, opts...)...)
		if err != nil {
			b.Fatal(err)
		}
		counters[i] = &busyCounter{Backend: be}
		l, err := core.New(counters[i])
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		lockers[i] = l
	}
	base := select1(b, admin, 1)
	holder, err := lockers[0].TryAcquire(ctx, "handoff")
	if err != nil {
		b.Fatal(err)
	}
	type result struct {
		s  core.Session
		at time.Time
	}
	var gaps []time.Duration
	// round passes the key from Locker i%2 to the other one.
	round := func(i int) time.Duration {
		next := (i + 1) % 2
		busy := counters[next].busy.Load()
		got := make(chan result, 1)
		go func() {
			s, err := lockers[next].Acquire(ctx, "handoff", core.Backoff(50*time.Millisecond, time.Second))
			if err != nil {
				b.Error(err)
			}
			got <- result{s, time.Now()}
		}()
		for counters[next].busy.Load() == busy { // the waiter's first attempt
			time.Sleep(100 * time.Microsecond)
		}
		released := time.Now()
		if err := holder.Release(ctx); err != nil {
			b.Fatal(err)
		}
		r := <-got
		if r.s == nil {
			b.FailNow()
		}
		holder = r.s
		return r.at.Sub(released)
	}
	for i := range 4 { // both Lockers subscribe (or find they cannot)
		round(i)
	}
	b.ResetTimer()
	for i := range b.N {
		gaps = append(gaps, round(i))
	}
	b.StopTimer()
	_ = holder.Release(ctx)
	p50 := reportWaits(b, gaps)
	b.ReportMetric(float64(gaps[len(gaps)-1].Microseconds())/1000, "max_ms")
	b.ReportMetric(float64(p50)/float64(base), "p50_x_select1")
	b.ReportMetric(float64(base.Microseconds()), "select1_µs")
}
