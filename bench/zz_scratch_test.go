package bench

import (
	"context"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/mysqllock"
)

func BenchmarkScratchUnc(b *testing.B) {
	st, _ := counted(b, "mysql")
	ctx := bg(b)
	ttlc := contenderFor(b, st, "ttlrow")
	dc := contenderFor(b, st, "dislock")
	be, err := mysqllock.NewBackend(ctx, st.newDB(), mysqllock.WithTable(name("dislock")), mysqllock.WithAutoMigrate())
	if err != nil {
		b.Fatal(err)
	}
	names := []string{"ttl", "engine", "raw"}
	ops := []func() error{
		func() error {
			u, err := ttlc.try(ctx, "kt")
			if err != nil {
				return err
			}
			return u(ctx)
		},
		func() error {
			u, err := dc.try(ctx, "kd")
			if err != nil {
				return err
			}
			return u(ctx)
		},
		func() error {
			l, err := be.TryAcquire(ctx, core.AcquireRequest{Key: "kr", Owner: "o", OwnerToken: "tok", TTL: 10 * time.Second})
			if err != nil {
				return err
			}
			return be.Release(ctx, core.ReleaseRequest{Key: "kr", OwnerToken: "tok", Token: l.Token})
		},
	}
	for _, op := range ops {
		for range 20 {
			if err := op(); err != nil {
				b.Fatal(err)
			}
		}
	}
	took := make([]time.Duration, len(ops))
	b.ResetTimer()
	for done := 0; done < b.N; done += 50 {
		for i, op := range ops {
			t0 := time.Now()
			for range 50 {
				if err := op(); err != nil {
					b.Fatal(err)
				}
			}
			took[i] += time.Since(t0)
		}
	}
	for i, n := range names {
		b.ReportMetric(float64(took[i].Microseconds())/float64(b.N), n+"-µs")
	}
	_ = context.Background
}
