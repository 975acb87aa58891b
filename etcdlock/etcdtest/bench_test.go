package etcdtest_test

// Benchmarks run against a private embedded etcd member (in this process:
// client and server share the CPU), or against DISLOCK_BENCH_ETCD (an
// etcd:// URL) when set. Every benchmark measures an etcd Get in the same
// run and reports its result as a ratio to it (x-get). etcd's own
// concurrency.Mutex runs in the same run for comparison:
//
//	cd etcdlock/etcdtest && go test -run '^$' -bench . -benchtime 2s .

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/etcdlock"
	"github.com/dislock/dislock/etcdlock/etcdtest"
	"github.com/dislock/dislock/internal/benchtest"
)

// benchEndpoints returns the endpoints benchmarks run against.
func benchEndpoints(b *testing.B) clientv3.Config {
	b.Helper()
	if raw := etcdtest.Shared(b); raw != "" { // DISLOCK_TEST_ETCD
		cfg, err := etcdlock.ParseURL(raw)
		if err != nil {
			b.Fatal(err)
		}
		return cfg
	}
	c := etcdtest.Start(b, 1)
	return clientv3.Config{Endpoints: c.DirectEndpoints()}
}

// benchWrites returns the endpoints benchmarks run against and a count of
// the Raft entries the server has applied (nil on DISLOCK_TEST_ETCD, whose
// server is not in this process).
func benchWrites(b *testing.B) (clientv3.Config, func() uint64) {
	b.Helper()
	if etcdtest.Shared(b) != "" {
		return benchEndpoints(b), nil
	}
	c := etcdtest.Start(b, 1)
	return clientv3.Config{Endpoints: c.DirectEndpoints()}, func() uint64 { return c.Applied(0) }
}

func benchClient(b *testing.B, cfg clientv3.Config, cnt *etcdtest.Counter) *clientv3.Client {
	b.Helper()
	cfg.Logger = zap.NewNop()
	if cnt != nil {
		cfg.DialOptions = append(cfg.DialOptions, cnt.DialOptions()...)
	}
	return etcdtest.NewClient(b, cfg)
}

// getLatency is the mean round trip of a serial Get.
func getLatency(b *testing.B, cli *clientv3.Client) time.Duration {
	return benchtest.Mean(b, 200, 2000, getter(cli))
}

// getter is one Get on cli.
func getter(cli *clientv3.Client) func() error {
	return func() error {
		_, err := cli.Get(context.Background(), "bench/rtt")
		return err
	}
}

// putter is one Put on cli.
func putter(cli *clientv3.Client) func() error {
	return func() error {
		_, err := cli.Put(context.Background(), "bench/put", "v")
		return err
	}
}

// putLatency is the mean round trip of a serial Put: a write through Raft,
// which every claim and release is.
func putLatency(b *testing.B, cli *clientv3.Client) time.Duration {
	return benchtest.Mean(b, 0, 1000, putter(cli))
}

func BenchmarkPut(b *testing.B) { benchRoundTrip(b, putLatency, putter) }

func BenchmarkGet(b *testing.B) { benchRoundTrip(b, getLatency, getter) }

// benchRoundTrip times op on a client of its own, after warming the client
// up with latency.
func benchRoundTrip(b *testing.B, latency func(*testing.B, *clientv3.Client) time.Duration,
	op func(*clientv3.Client) func() error) {
	cli := benchClient(b, benchEndpoints(b), nil)
	latency(b, cli)
	benchtest.Loop(b, op(cli))
}

// interleaved runs op b.N times, each after one Get on cli, timing both,
// so that the ratio holds under the same load (benchtest.Interleaved). cnt,
// when set, counts op's requests: req/op (unary calls and streams opened)
// and msgs/op (those and the messages sent on open streams, such as
// keepalives on the Backend's lease stream).
func interleaved(b *testing.B, cli *clientv3.Client, cnt *etcdtest.Counter, op func() error) {
	getLatency(b, cli) // warm up
	var reqs, msgs int64
	counted := op
	if cnt != nil {
		counted = func() error {
			n0, m0 := cnt.Requests(), cnt.StreamMsgs.Load()
			err := op()
			n := cnt.Requests() - n0
			reqs += n
			msgs += n + cnt.StreamMsgs.Load() - m0
			return err
		}
	}
	benchtest.Interleaved(b, "get", getter(cli), counted)
	if cnt != nil {
		b.ReportMetric(float64(reqs)/float64(b.N), "req/op")
		b.ReportMetric(float64(msgs)/float64(b.N), "msgs/op")
	}
}

// BenchmarkTryAcquireRelease: one uncontended TryAcquire + Release (the
// claim transaction on the shared lease and the owner-checked delete; a
// keepalive of the lease on the open stream goes with a claim only once per
// Slack, half a renew interval).
func BenchmarkTryAcquireRelease(b *testing.B) {
	uncontended(b, func(cli *clientv3.Client) func() error {
		return benchtest.AcquireRelease(newLocker(b, cli, uniquePrefix("bench")), "uncontended")
	})
}

// uncontended runs the op that mk makes on a counted client, interleaved
// with a Get each.
func uncontended(b *testing.B, mk func(cli *clientv3.Client) func() error) {
	cnt := &etcdtest.Counter{}
	cli := benchClient(b, benchEndpoints(b), cnt)
	interleaved(b, cli, cnt, mk(cli))
}

// session is a concurrency.Session of the given TTL (seconds) on cli,
// closed when b ends.
func session(b *testing.B, cli *clientv3.Client, ttl int) *concurrency.Session {
	b.Helper()
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(ttl))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// tryLockUnlock is one TryLock and Unlock of m.
func tryLockUnlock(ctx context.Context, m *concurrency.Mutex) error {
	if err := m.TryLock(ctx); err != nil {
		return err
	}
	return m.Unlock(ctx)
}

// BenchmarkConcurrencyMutex is etcd's concurrency package doing the same:
// a session (lease grant and its keepalive stream), Mutex.TryLock, Unlock,
// and the session's Close (revoke).
func BenchmarkConcurrencyMutex(b *testing.B) {
	uncontended(b, func(cli *clientv3.Client) func() error {
		prefix := uniquePrefix("bench-mutex")
		return func() error {
			sess, err := concurrency.NewSession(cli, concurrency.WithTTL(30))
			if err != nil {
				return err
			}
			if err := tryLockUnlock(context.Background(), concurrency.NewMutex(sess, prefix+"uncontended")); err != nil {
				sess.Close()
				return err
			}
			return sess.Close()
		}
	})
}

// handoff runs benchtest.Handoff with the waiters mk makes, whose clients
// cnt counts, and reports the hand-off latencies (from the start of a
// release to the return of the next holder's acquire), also as ratios to a
// Get (get) and a Put (put) measured before, and per acquisition the
// requests (unary calls and streams opened; the keepalives on a stream are
// not counted) and the server writes (Raft entries applied; 0 when writes
// is nil).
func handoff(b *testing.B, cnt *etcdtest.Counter, writes func() uint64, get, put time.Duration, mk func(i int) (func(context.Context) error, func() error)) {
	const waiters = 16
	if writes == nil {
		writes = func() uint64 { return 0 }
	}
	reqs0, w0 := cnt.Requests(), writes()
	lat, n := benchtest.Handoff(b, waiters, mk)
	if p50, _, ok := benchtest.ReportHandoff(b, lat); ok {
		b.ReportMetric(float64(p50)/float64(get), "p50-x-get")
		b.ReportMetric(float64(p50)/float64(put), "p50-x-put")
		b.ReportMetric(float64(get.Microseconds())/1000, "get-ms")
	}
	if n == 0 {
		return
	}
	b.ReportMetric(float64(cnt.Requests()-reqs0)/float64(n), "req/acq")
	b.ReportMetric(float64(writes()-w0)/float64(n), "writes/acq")
}

// BenchmarkHandoff: 16 waiters on one key, each holding it ~1 ms, in one
// Locker or in 16 (16 processes).
func BenchmarkHandoff(b *testing.B) {
	for _, procs := range []int{16, 1} {
		b.Run(fmt.Sprintf("lockers=%d", procs), func(b *testing.B) { benchHandoff(b, procs) })
	}
}

func benchHandoff(b *testing.B, procs int) {
	cfg, writes := benchWrites(b)
	probe := benchClient(b, cfg, nil)
	get, put := getLatency(b, probe), putLatency(b, probe)
	prefix := uniquePrefix("bench-handoff")
	cnt := &etcdtest.Counter{}
	lockers := make([]core.Locker, procs)
	for i := range lockers {
		lockers[i] = newLocker(b, benchClient(b, cfg, cnt), prefix, core.WithDefaults(core.TTL(10*time.Second)))
	}
	handoff(b, cnt, writes, get, put, benchtest.Turns(lockers, "handoff"))
}

// BenchmarkConcurrencyMutexHandoff: the same with concurrency.Mutex, 16
// sessions on 16 clients (Mutex waits on the previous waiter's key).
func BenchmarkConcurrencyMutexHandoff(b *testing.B) {
	const waiters = 16
	cfg, writes := benchWrites(b)
	probe := benchClient(b, cfg, nil)
	get, put := getLatency(b, probe), putLatency(b, probe)
	prefix := uniquePrefix("bench-mutex-handoff")
	cnt := &etcdtest.Counter{}
	sessions := make([]*concurrency.Session, waiters)
	for i := range sessions {
		sessions[i] = session(b, benchClient(b, cfg, cnt), 10)
	}
	handoff(b, cnt, writes, get, put, func(i int) (func(context.Context) error, func() error) {
		m := concurrency.NewMutex(sessions[i], prefix+"handoff")
		return m.Lock, func() error { return m.Unlock(context.Background()) }
	})
}

// BenchmarkHold1000: one Locker holds 1,000 leases (TTL 1.5 s, so 2 s
// leases, renewed every 500 ms). Each iteration is one renew interval;
// reported per interval: unary requests (transactions), streams opened and
// stream messages (keepalives).
func BenchmarkHold1000(b *testing.B) { hold1000(b, 1) }

// BenchmarkHold1000Permits is BenchmarkHold1000 with 1,000 permits: 250
// semaphores of 4, all permits held by the one Locker.
func BenchmarkHold1000Permits(b *testing.B) { hold1000(b, 4) }

func hold1000(b *testing.B, limit int) {
	const n = 1000
	ttl := 1500 * time.Millisecond
	interval := ttl / 3
	cfg := benchEndpoints(b)
	cnt := &etcdtest.Counter{}
	cli := benchClient(b, cfg, cnt)
	l := newLocker(b, cli, uniquePrefix("bench-hold"), core.WithDefaults(core.TTL(ttl)))
	ctx := context.Background()
	var u0, s0, m0 int64
	intervals := benchtest.Hold(b, n, interval, func(i int) (core.Session, error) {
		return l.TryAcquire(ctx, fmt.Sprintf("hold/%d", i/limit), core.Limit(limit))
	}, func() { u0, s0, m0 = cnt.Unary.Load(), cnt.Streams.Load(), cnt.StreamMsgs.Load() })
	b.ReportMetric(float64(cnt.Unary.Load()-u0)/intervals, "txns/interval")
	b.ReportMetric(float64(cnt.Streams.Load()-s0)/intervals, "streams/interval")
	b.ReportMetric(float64(cnt.StreamMsgs.Load()-m0)/intervals, "keepalives/interval")
}

// BenchmarkSemaphore: one uncontended TryAcquire + Release of a permit of a
// semaphore of 4, next to the same for a mutex and a raw Get, all timed in
// the same run (interleaved with a Get each: see x-get).
//
//	cd etcdlock/etcdtest && go test -run '^$' -bench Semaphore -benchtime 500x .
func BenchmarkSemaphore(b *testing.B) {
	cfg := benchEndpoints(b)
	for _, bc := range []struct {
		name string
		opts []core.Option
	}{
		{"mutex", nil},
		{"permit-of-4", []core.Option{core.Limit(4)}},
		{"permit-of-4-3-held", []core.Option{core.Limit(4)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			cnt := &etcdtest.Counter{}
			cli := benchClient(b, cfg, cnt)
			prefix := uniquePrefix("bench-sem")
			l := newLocker(b, cli, prefix)
			ctx := context.Background()
			if bc.name == "permit-of-4-3-held" {
				// Three permits held by another process.
				other := newLocker(b, benchClient(b, cfg, nil), prefix)
				for range 3 {
					s, err := other.TryAcquire(ctx, "sem", bc.opts...)
					if err != nil {
						b.Fatal(err)
					}
					defer s.Release(ctx)
				}
			}
			interleaved(b, cli, cnt, func() error {
				s, err := l.TryAcquire(ctx, "sem", bc.opts...)
				if err != nil {
					return err
				}
				return s.Release(ctx)
			})
		})
	}
}

// BenchmarkHotKeyTry: TryAcquire of a key another process holds, by
// dislock and by concurrency.Mutex.TryLock (a session of its own), timed
// against a Get in the same run; writes/op is the Raft entries the server
// applied per failed try.
func BenchmarkHotKeyTry(b *testing.B) {
	cfg, writes := benchWrites(b)
	ctx := context.Background()
	prefix := uniquePrefix("bench-hot")
	report := func(b *testing.B, w0 uint64) {
		if writes != nil {
			b.ReportMetric(float64(writes()-w0)/float64(b.N), "writes/op")
		}
	}
	w := func() uint64 {
		if writes == nil {
			return 0
		}
		return writes()
	}
	b.Run("dislock", func(b *testing.B) {
		holder := newLocker(b, benchClient(b, cfg, nil), prefix)
		s, err := holder.TryAcquire(ctx, "hot")
		if err != nil {
			b.Fatal(err)
		}
		defer s.Release(ctx)
		cnt := &etcdtest.Counter{}
		cli := benchClient(b, cfg, cnt)
		l := newLocker(b, cli, prefix)
		w0 := w()
		interleaved(b, cli, cnt, func() error {
			_, err := l.TryAcquire(ctx, "hot")
			if !errors.Is(err, core.ErrNotAcquired) {
				return fmt.Errorf("want busy, got %v", err)
			}
			return nil
		})
		report(b, w0)
	})
	b.Run("mutex", func(b *testing.B) {
		hm := concurrency.NewMutex(session(b, benchClient(b, cfg, nil), 30), prefix+"mutex-hot")
		if err := hm.Lock(ctx); err != nil {
			b.Fatal(err)
		}
		cnt := &etcdtest.Counter{}
		cli := benchClient(b, cfg, cnt)
		m := concurrency.NewMutex(session(b, cli, 30), prefix+"mutex-hot")
		w0 := w()
		interleaved(b, cli, cnt, func() error {
			if err := m.TryLock(ctx); !errors.Is(err, concurrency.ErrLocked) {
				return fmt.Errorf("want ErrLocked, got %v", err)
			}
			return nil
		})
		report(b, w0)
	})
}

// BenchmarkDistinctKeys: 64 goroutines of one client, each taking and
// releasing a key of its own, by dislock (one Locker) and by
// concurrency.Mutex (one session); x-rtt-rate is acquisitions per second
// divided by serial Gets per second, measured first; req/op and msgs/op
// count requests as interleaved does (the client's, per acquisition).
func BenchmarkDistinctKeys(b *testing.B) {
	const workers = 64
	cfg, _ := benchWrites(b)
	ctx := context.Background()
	prefix := uniquePrefix("bench-keys")
	run := func(b *testing.B, cli *clientv3.Client, cnt *etcdtest.Counter, op func(key string) error) {
		get := getLatency(b, cli)
		n0, m0 := cnt.Requests(), cnt.StreamMsgs.Load()
		keys := make([]string, workers)
		for i := range keys {
			keys[i] = fmt.Sprintf("k%d", i)
		}
		var next atomic.Int64
		b.ResetTimer()
		start := time.Now()
		benchtest.Parallel(b, workers, func() bool { return next.Add(1) > int64(b.N) }, func(w int) error { return op(keys[w]) })
		el := time.Since(start)
		b.StopTimer()
		if b.Failed() {
			b.FailNow()
		}
		rate := float64(b.N) / el.Seconds()
		b.ReportMetric(rate, "acq/s")
		b.ReportMetric(rate*get.Seconds(), "x-rtt-rate")
		reqs := cnt.Requests() - n0
		b.ReportMetric(float64(reqs)/float64(b.N), "req/op")
		b.ReportMetric(float64(reqs+cnt.StreamMsgs.Load()-m0)/float64(b.N), "msgs/op")
	}
	b.Run("dislock", func(b *testing.B) {
		cnt := &etcdtest.Counter{}
		cli := benchClient(b, cfg, cnt)
		l := newLocker(b, cli, prefix)
		run(b, cli, cnt, func(key string) error {
			s, err := l.TryAcquire(ctx, key)
			if err != nil {
				return err
			}
			return s.Release(ctx)
		})
	})
	b.Run("mutex", func(b *testing.B) {
		cnt := &etcdtest.Counter{}
		cli := benchClient(b, cfg, cnt)
		sess := session(b, cli, 30)
		run(b, cli, cnt, func(key string) error {
			return tryLockUnlock(ctx, concurrency.NewMutex(sess, prefix+"mutex-"+key))
		})
	})
}

// BenchmarkConcurrencyMutexSession is BenchmarkConcurrencyMutex on one
// session kept open, as a program holding a session uses it: TryLock and
// Unlock only.
func BenchmarkConcurrencyMutexSession(b *testing.B) {
	uncontended(b, func(cli *clientv3.Client) func() error {
		m := concurrency.NewMutex(session(b, cli, 30), uniquePrefix("bench-mutex-session")+"uncontended")
		return func() error { return tryLockUnlock(context.Background(), m) }
	})
}
