package pg

import (
	"context"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BenchmarkClaimBound measures what the claim bound adds to an acquire:
// each iteration runs a SELECT 1, the acquire statement alone (as it would
// be sent without the bound) and TryAcquire (the statement batched after
// the bound), in alternating order on one connection, so that all three see
// the same load. It reports each as a ratio to the SELECT 1 (x_select1) and
// the bounded acquire as a ratio to the unbounded one (x_unbounded). "free"
// takes a free key (and releases it, untimed); "busy" is a try on a held
// key, the read-only path.
func BenchmarkClaimBound(b *testing.B) {
	for _, mode := range []struct {
		name  string
		async bool
		busy  bool
	}{{"free-durable", false, false}, {"free-async", true, false}, {"busy", false, true}} {
		b.Run(mode.name, func(b *testing.B) {
			ctx := context.Background()
			cfg, err := pgxpool.ParseConfig(testenv.PG(b))
			if err != nil {
				b.Fatal(err)
			}
			cfg.MaxConns, cfg.MinConns = 1, 1
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer pool.Close()
			table := testenv.Name("dislock_bench_")
			opts := []Option{WithTable(table), WithAutoMigrate()}
			if mode.async {
				opts = append(opts, WithAsyncCommit())
			}
			be, err := NewBackend(ctx, pool, opts...)
			if err != nil {
				b.Fatal(err)
			}
			defer pool.Exec(ctx, "DROP TABLE "+pgx.Identifier{table}.Sanitize()+", "+pgx.Identifier{table + "_permits"}.Sanitize())
			if mode.busy {
				if _, err := be.TryAcquire(ctx, core.AcquireRequest{Key: "k", Owner: "h", OwnerToken: "h", TTL: time.Hour}); err != nil {
					b.Fatal(err)
				}
			}
			unbounded := func(tok string) error {
				rows, err := pool.Query(ctx, be.stmt.claim, "k", "me", tok, micro(time.Minute), nil)
				if err != nil {
					return err
				}
				rows.Close()
				return rows.Err()
			}
			bounded := func(tok string) error {
				_, err := be.TryAcquire(ctx, core.AcquireRequest{Key: "k", Owner: "me", OwnerToken: tok, TTL: time.Minute})
				if mode.busy && errors.Is(err, core.ErrNotAcquired) {
					return nil
				}
				return err
			}
			select1 := func(string) error {
				var one int
				return pool.QueryRow(ctx, "SELECT 1").Scan(&one)
			}
			ops := []func(string) error{select1, unbounded, bounded}
			var spent [3]time.Duration
			for i := 0; b.Loop(); i++ {
				for j := range ops {
					k := (i + j) % len(ops) // rotate the order
					tok := rand.Text()
					start := time.Now()
					if err := ops[k](tok); err != nil {
						b.Fatal(err)
					}
					spent[k] += time.Since(start)
					if k > 0 && !mode.busy {
						if err := be.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: tok}); err != nil {
							b.Fatal(err)
						}
					}
				}
			}
			b.ReportMetric(float64(spent[1])/float64(spent[0]), "unbounded_x_select1")
			b.ReportMetric(float64(spent[2])/float64(spent[0]), "bounded_x_select1")
			b.ReportMetric(float64(spent[2])/float64(spent[1]), "x_unbounded")
			b.ReportMetric(float64(spent[0].Microseconds())/float64(b.N), "select1_µs")
		})
	}
}
