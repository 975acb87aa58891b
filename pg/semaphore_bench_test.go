package pg_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/benchtest"
)

// Acquire + release of one permit of a semaphore of 4 against a mutex and
// a SELECT 1 round trip, in the same run (x_select1: time per operation ÷
// time per SELECT 1 at the same concurrency, on the same pool):
//
//   - seq: one goroutine, one key;
//   - par4: 4 goroutines; the permits share one key of limit 4 (never
//     busy, but serialised on the key's header row), the mutexes take 4
//     distinct keys.
func BenchmarkPermitAcquireRelease(b *testing.B) {
	for _, mode := range commitModes {
		for _, par := range []int{1, 4} {
			for _, kind := range []string{"select1", "mutex", "permit4"} {
				name := fmt.Sprintf("%s/%s/par%d", mode.name, kind, par)
				b.Run(name, func(b *testing.B) {
					pool := benchPool(b, 4)
					l := benchLocker(b, pool, benchTable(b, pool), mode.opts...)
					ctx := context.Background()
					base := select1(b, pool, par)
					one := selectOne(pool)
					op := func(int) error { return one() }
					switch kind {
					case "mutex":
						op = func(w int) error {
							s, err := l.TryAcquire(ctx, fmt.Sprintf("m%d", w), core.TTL(time.Minute))
							if err != nil {
								return err
							}
							return s.Release(ctx)
						}
					case "permit4":
						op = func(int) error {
							s, err := l.TryAcquire(ctx, "sem", core.Limit(4), core.TTL(time.Minute))
							if err != nil {
								return err
							}
							return s.Release(ctx)
						}
					}
					b.ResetTimer()
					if par == 1 {
						for b.Loop() {
							if err := op(0); err != nil {
								b.Fatal(err)
							}
						}
					} else {
						var left atomic.Int64
						left.Store(int64(b.N))
						benchtest.Parallel(b, par, func() bool { return left.Add(-1) < 0 }, op)
					}
					reportRatio(b, base)
				})
			}
		}
	}
}

// Holding 1,000 permits (250 keys of limit 4) on one Locker: renew calls
// (each one batch, one round trip) per renew interval, and committed
// transactions on the database per interval.
func BenchmarkHoldPermits1000(b *testing.B) {
	const keys, limit = 250, 4
	benchHold(b, keys*limit, "renew_calls/interval", "permits_renewed/interval", func(ctx context.Context, l core.Locker, i int, ttl time.Duration) error {
		_, err := l.TryAcquire(ctx, fmt.Sprintf("sem-%d", i%keys), core.Limit(limit), core.TTL(ttl))
		return err
	})
}
