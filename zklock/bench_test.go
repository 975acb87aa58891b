package zklock_test

// Benchmarks run against a private standalone ZooKeeper server started for
// them, or against DISLOCK_BENCH_ZK (host:port) when set. Each one measures
// the round trip of a raw Exists in the same run and reports its result as a
// ratio to it (x-rtt), and counts the requests the client sent (req/op;
// pings excluded). go-zookeeper's own zk.Lock runs in the same run for
// comparison:
//
//	go test -run '^$' -bench . -benchtime 2000x ./zklock/

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/benchtest"
	"github.com/dislock/dislock/internal/zktest"
	"github.com/dislock/dislock/zklock"
)

func benchServer(b *testing.B) string {
	b.Helper()
	if s := os.Getenv("DISLOCK_BENCH_ZK"); s != "" {
		return s
	}
	return ensemble(b, 1).Connect()
}

// counter counts the requests written on the connections it dialed (every
// frame but pings).
type counter = zktest.Counter

func benchConn(b *testing.B, connect string, cnt *counter) *zk.Conn {
	return zktest.Session(b, connect, 10*time.Second, cnt)
}

// benchLocker is a Locker under root whose session dials with dial (nil:
// the default), closed when b ends.
func benchLocker(b *testing.B, connect, root string, dial zk.Dialer) *core.Client {
	b.Helper()
	opts := []zklock.Option{zklock.WithRoot(root), zklock.WithSessionTimeout(15 * time.Second),
		zklock.WithClientOptions(core.WithDefaults(core.TTL(10 * time.Second)))}
	if dial != nil {
		opts = append(opts, zklock.WithDialer(dial))
	}
	l, err := zklock.New(context.Background(), connect, opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return l
}

// existsRTT is the mean round trip of Exists, serial.
func existsRTT(b *testing.B, c *zk.Conn) time.Duration {
	return benchtest.Mean(b, 200, 2000, exists(c))
}

// exists is one Exists on c.
func exists(c *zk.Conn) func() error {
	return func() error {
		_, _, err := c.Exists("/")
		return err
	}
}

// interleaved runs op b.N times, each after one Exists on c, timing both,
// so that the ratio holds under the same load (benchtest.Interleaved).
func interleaved(b *testing.B, c *zk.Conn, cnt *counter, op func() error) {
	existsRTT(b, c) // warm up
	n0 := cnt.Reqs.Load()
	benchtest.Interleaved(b, "rtt", exists(c), op)
	b.ReportMetric(float64(cnt.Reqs.Load()-n0)/float64(b.N), "req/op")
}

func BenchmarkExists(b *testing.B) {
	c := benchConn(b, benchServer(b), nil)
	existsRTT(b, c)
	benchtest.Loop(b, exists(c))
}

// BenchmarkSetData is one write (a quorum write on an ensemble): what every
// acquire, renewal and release costs at least.
func BenchmarkSetData(b *testing.B) {
	connect := benchServer(b)
	raw := benchConn(b, connect, nil)
	var cnt counter
	c := benchConn(b, connect, &cnt)
	p := testRoot()
	if _, err := c.Create(p, nil, zk.FlagPersistent, zk.WorldACL(zk.PermAll)); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Delete(p, -1) })
	interleaved(b, raw, &cnt, func() error {
		_, err := c.Set(p, nil, -1)
		return err
	})
}

// BenchmarkTryAcquireRelease: one uncontended TryAcquire + Release.
func BenchmarkTryAcquireRelease(b *testing.B) {
	connect := benchServer(b)
	raw := benchConn(b, connect, nil)
	var cnt counter
	l := benchLocker(b, connect, testRoot(), cnt.Dial)
	interleaved(b, raw, &cnt, benchtest.AcquireRelease(l, "uncontended"))
}

// BenchmarkZkLockUnlock is the same with go-zookeeper's zk.Lock.
func BenchmarkZkLockUnlock(b *testing.B) {
	connect := benchServer(b)
	raw := benchConn(b, connect, nil)
	var cnt counter
	c := benchConn(b, connect, &cnt)
	lock := zk.NewLock(c, testRoot()+"/zklock-uncontended", zk.WorldACL(zk.PermAll))
	if err := lock.Lock(); err != nil { // creates the parents
		b.Fatal(err)
	}
	lock.Unlock()
	interleaved(b, raw, &cnt, func() error {
		if err := lock.Lock(); err != nil {
			return err
		}
		return lock.Unlock()
	})
}

// BenchmarkHandoff: 16 waiters on one key, each holding it ~1ms, in one
// Locker or in 16 (each with its own session). Latency is from the start of
// a Release to the return of the next Acquire.
func BenchmarkHandoff(b *testing.B) {
	for _, procs := range []int{16, 1} {
		b.Run(fmt.Sprintf("lockers=%d", procs), func(b *testing.B) {
			connect := benchServer(b)
			root := testRoot()
			var cnt counter
			lockers := make([]core.Locker, procs)
			for i := range lockers {
				lockers[i] = benchLocker(b, connect, root, cnt.Dial)
			}
			handoff(b, benchConn(b, connect, nil), &cnt, benchtest.Turns(lockers, "handoff"))
		})
	}
}

// BenchmarkZkLockHandoff is the same with go-zookeeper's zk.Lock (it waits
// in line: each waiter watches its predecessor).
func BenchmarkZkLockHandoff(b *testing.B) {
	for _, procs := range []int{16, 1} {
		b.Run(fmt.Sprintf("conns=%d", procs), func(b *testing.B) {
			connect := benchServer(b)
			path := testRoot() + "/zklock-handoff"
			var cnt counter
			conns := make([]*zk.Conn, procs)
			for i := range conns {
				conns[i] = benchConn(b, connect, &cnt)
			}
			handoff(b, benchConn(b, connect, nil), &cnt, func(i int) (func(context.Context) error, func() error) {
				lock := zk.NewLock(conns[i%procs], path, zk.WorldACL(zk.PermAll))
				return func(ctx context.Context) error {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					return lock.Lock() // no context: the last waiters are released by Close
				}, lock.Unlock
			})
		})
	}
}

// handoff runs 16 waiters, each made by mk (acquire, release), until b.N
// hand-offs, and reports the latency percentiles, also as ratios to an
// Exists round trip, and the requests per acquisition.
func handoff(b *testing.B, raw *zk.Conn, cnt *counter, mk func(i int) (func(context.Context) error, func() error)) {
	const waiters = 16
	rtt := existsRTT(b, raw)
	n0 := cnt.Reqs.Load()
	lat, acquired := benchtest.Handoff(b, waiters, mk)
	rtt = (rtt + existsRTT(b, raw)) / 2 // before and after: the load may change
	p50, p99, ok := benchtest.ReportHandoff(b, lat)
	if !ok {
		return
	}
	b.ReportMetric(float64(p50)/float64(rtt), "p50-x-rtt")
	b.ReportMetric(float64(p99)/float64(rtt), "p99-x-rtt")
	b.ReportMetric(float64(cnt.Reqs.Load()-n0)/float64(acquired), "req/acq")
	b.ReportMetric(float64(rtt.Microseconds())/1000, "rtt-ms")
}

// BenchmarkSemaphore: one uncontended TryAcquire + Release of a permit of a
// semaphore of 4, next to the same for a mutex, each interleaved with an
// Exists (x-rtt) in the same run. "3-held": three permits are held by
// another session, so the claim is not the key's only child and costs a
// read of the children as well.
//
//	go test -run '^$' -bench Semaphore -benchtime 500x ./zklock/
func BenchmarkSemaphore(b *testing.B) {
	connect := benchServer(b)
	for _, bc := range []struct {
		name string
		opts []core.Option
		held int
	}{
		{"mutex", nil, 0},
		{"permit-of-4", []core.Option{core.Limit(4)}, 0},
		{"permit-of-4-3-held", []core.Option{core.Limit(4)}, 3},
	} {
		b.Run(bc.name, func(b *testing.B) {
			raw := benchConn(b, connect, nil)
			var cnt counter
			root := testRoot()
			l := benchLocker(b, connect, root, cnt.Dial)
			ctx := context.Background()
			if bc.held > 0 {
				other := benchLocker(b, connect, root, nil)
				for range bc.held {
					s, err := other.TryAcquire(ctx, "sem", bc.opts...)
					if err != nil {
						b.Fatal(err)
					}
					defer s.Release(ctx)
				}
			}
			interleaved(b, raw, &cnt, func() error {
				s, err := l.TryAcquire(ctx, "sem", bc.opts...)
				if err != nil {
					return err
				}
				return s.Release(ctx)
			})
		})
	}
}
