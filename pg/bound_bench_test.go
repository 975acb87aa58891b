package pg

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/benchtest"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BenchmarkClaimBound measures what the claim bound adds to an acquire:
// each iteration runs a SELECT 1, the claim statement without its bound
// (inBound's column replaced by a constant) and TryAcquire (the statement
// with it), in alternating order on one connection, so that all three see
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
			var opts []Option
			if mode.async {
				opts = append(opts, WithAsyncCommit())
			}
			pool, be := oneConnBackend(b, opts...)
			if mode.busy {
				if _, err := be.TryAcquire(ctx, core.AcquireRequest{Key: "k", Owner: "h", OwnerToken: "h", TTL: time.Hour}); err != nil {
					b.Fatal(err)
				}
			}
			claim := strings.Replace(be.stmt.claim, inBound("$6"), "0", 1)
			if claim == be.stmt.claim {
				b.Fatal("the claim statement has no bound to take out")
			}
			unbounded := func(tok string) error {
				rows, err := pool.Query(ctx, claim, "k", "me", tok, micro(time.Minute), nil)
				if err != nil {
					return err
				}
				rows.Close()
				return rows.Err()
			}
			bounded := func(tok string) error {
				be.hints.Note("k", 0) // the claim, not the read of a key known held
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

// BenchmarkStatementCPU is the server's CPU time per operation, one at a
// time on one connection (the server process's, read from /proc: only when
// the server runs on this machine), beside a SELECT 1 on the same
// connection: where the server's time goes. Commits are asynchronous, so
// that a commit's flush does not count. claim+release is a TryAcquire and
// its Release; acquire+release the same with a waiter (the statement with
// the queue's branches); busy/claim a try on a key held by another owner
// (the claim, which writes nothing); busy/peek the read that such a
// try sends once the Backend knows the key held (peek.go).
func BenchmarkStatementCPU(b *testing.B) {
	ctx := context.Background()
	pool, be := oneConnBackend(b, WithAsyncCommit())
	var pid int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		b.Fatal(err)
	}
	if _, ok := benchtest.ProcCPU(pid); !ok {
		b.Skip("the server does not run on this machine")
	}
	if _, err := be.TryAcquire(ctx, core.AcquireRequest{Key: "held", Owner: "h", OwnerToken: "h", TTL: time.Hour}); err != nil {
		b.Fatal(err)
	}
	cycle := func(waiter string) func() error {
		return func() error {
			tok := rand.Text()
			req := core.AcquireRequest{Key: "free", Owner: "me", OwnerToken: tok, TTL: time.Minute, Waiter: waiter, WaiterTTL: time.Minute}
			if _, err := be.TryAcquire(ctx, req); err != nil {
				return err
			}
			return be.Release(ctx, core.ReleaseRequest{Key: "free", OwnerToken: tok})
		}
	}
	busy := func(err error) error {
		if errors.Is(err, core.ErrNotAcquired) {
			return nil
		}
		return fmt.Errorf("a try of a held key: %v, want busy", err)
	}
	tryHeld := core.AcquireRequest{Key: "held", Owner: "me", OwnerToken: "me", TTL: time.Minute}
	ops := []struct {
		name string
		op   func() error
	}{
		{"select1", func() error { var one int; return pool.QueryRow(ctx, "SELECT 1").Scan(&one) }},
		{"claim+release", cycle("")},
		{"acquire+release", cycle("w")},
		{"busy/claim", func() error {
			be.hints.Note("held", 0) // unknown: the claim is sent
			_, err := be.TryAcquire(ctx, tryHeld)
			return busy(err)
		}},
		{"busy/peek", func() error {
			conn, err := pool.Acquire(ctx)
			if err != nil {
				return err
			}
			defer conn.Release()
			return busy(be.peek(ctx, conn, tryHeld))
		}},
	}
	for _, o := range ops {
		b.Run(o.name, func(b *testing.B) {
			for range 20 { // prepare the statements
				if err := o.op(); err != nil {
					b.Fatal(err)
				}
			}
			cpu0, _ := benchtest.ProcCPU(pid)
			for b.Loop() {
				if err := o.op(); err != nil {
					b.Fatal(err)
				}
			}
			cpu1, _ := benchtest.ProcCPU(pid)
			b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(b.N), "srv-cpu-µs/op")
		})
	}
}

// oneConnBackend returns a Backend with opts on a pool of one connection and
// a table of its own, both gone when b ends.
func oneConnBackend(b *testing.B, opts ...Option) (*pgxpool.Pool, *Backend) {
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
	b.Cleanup(pool.Close)
	table := testenv.Name("dislock_bench_")
	be, err := NewBackend(ctx, pool, append([]Option{WithTable(table), WithAutoMigrate()}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		pool.Exec(ctx, "DROP TABLE "+pgx.Identifier{table}.Sanitize()+", "+pgx.Identifier{table + "_permits"}.Sanitize())
	})
	return pool, be
}
