// Package benchtest holds the loops the backends' benchmarks share: a store
// round trip timed serially or on many goroutines at once, an operation
// timed against one in the same run, a hand-off among waiters on one key,
// and a Locker holding many leases over renew intervals; and the mixed
// leases whose batch renewal the backends' request-count tests renew. Each
// backend keeps its own probe (PING, Get, Exists, SELECT 1), request counts
// and metric names.
package benchtest

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

// Mean calls op warm times, then n times, and returns the mean time of the
// n calls: a serial round trip.
func Mean(b *testing.B, warm, n int, op func() error) time.Duration {
	b.Helper()
	for range warm {
		_ = op()
	}
	start := time.Now()
	for range n {
		if err := op(); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start) / time.Duration(n)
}

// Loop resets the timer and calls op b.N times, failing b at its first
// error: the benchmark of a plain round trip to the store, once the caller
// has warmed its client up.
func Loop(b *testing.B, op func() error) {
	b.Helper()
	b.ResetTimer()
	for range b.N {
		if err := op(); err != nil {
			b.Fatal(err)
		}
	}
}

// Parallel runs op on g goroutines, w being the goroutine's number, each
// until done says stop or op fails (which fails tb).
func Parallel(tb testing.TB, g int, done func() bool, op func(w int) error) {
	var wg sync.WaitGroup
	for w := range g {
		wg.Go(func() {
			for !done() {
				if err := op(w); err != nil {
					tb.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// Rate runs op on g goroutines for d and returns the calls that succeeded
// per second: a store's round trips per second at that concurrency.
func Rate(tb testing.TB, g int, d time.Duration, op func() error) float64 {
	var n atomic.Int64
	stop := time.Now().Add(d)
	start := time.Now()
	Parallel(tb, g, func() bool { return !time.Now().Before(stop) }, func(int) error {
		err := op()
		if err == nil {
			n.Add(1)
		}
		return err
	})
	return float64(n.Load()) / time.Since(start).Seconds()
}

// Interleaved runs op b.N times, each after one probe (a plain round trip
// to the store), timing both, so that their ratio holds under the same load
// (the machine may be shared). It resets the timer first and stops it at
// the end, and reports op-ns, <probe>-ns and x-<probe> (op time ÷ probe
// time).
func Interleaved(b *testing.B, probeName string, probe, op func() error) {
	b.Helper()
	var probeT, opT time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if err := probe(); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := op(); err != nil {
			b.Fatal(err)
		}
		opT += time.Since(t1)
		probeT += t1.Sub(t0)
	}
	b.StopTimer()
	b.ReportMetric(float64(opT.Nanoseconds())/float64(b.N), "op-ns")
	b.ReportMetric(float64(probeT.Nanoseconds())/float64(b.N), probeName+"-ns")
	b.ReportMetric(float64(opT)/float64(probeT), "x-"+probeName)
}

// Handoff runs waiters goroutines that take turns on one key until b.N
// hand-offs, each holding it about 1ms (the work). Waiter i acquires and
// releases with what mk(i) returns; acquire's ctx is cancelled once the
// last hand-off is done. The timer is reset first and stopped at the end.
// It returns the hand-off latencies, from the start of a release to the
// return of the next acquire, sorted, and the number of acquisitions.
func Handoff(b *testing.B, waiters int, mk func(i int) (acquire func(context.Context) error, release func() error)) (lat []time.Duration, acquired int64) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu        sync.Mutex
		released  atomic.Int64 // UnixNano of the last release's start, 0 = none yet
		remaining atomic.Int64
		n         atomic.Int64
		wg        sync.WaitGroup
	)
	remaining.Store(int64(b.N))
	b.ResetTimer()
	for i := range waiters {
		acquire, release := mk(i)
		wg.Go(func() {
			for {
				if err := acquire(ctx); err != nil {
					return
				}
				if ctx.Err() != nil { // an acquire that cannot be cancelled: give it back
					release()
					return
				}
				n.Add(1)
				now := time.Now().UnixNano()
				if r := released.Load(); r != 0 {
					mu.Lock()
					lat = append(lat, time.Duration(now-r))
					mu.Unlock()
				}
				time.Sleep(time.Millisecond) // the work
				last := remaining.Add(-1) <= 0
				released.Store(time.Now().UnixNano())
				release()
				if last {
					cancel()
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	slices.Sort(lat)
	return lat, n.Load()
}

// Turns returns, for Handoff, waiter i's Acquire and Release of key on
// lockers[i % len(lockers)].
func Turns(lockers []core.Locker, key string) func(i int) (func(context.Context) error, func() error) {
	return func(i int) (func(context.Context) error, func() error) {
		l := lockers[i%len(lockers)]
		var s core.Session
		return func(ctx context.Context) error {
				var err error
				s, err = l.Acquire(ctx, key)
				return err
			}, func() error {
				return s.Release(context.Background())
			}
	}
}

// Quantile returns the q quantile (0 to 1) of sorted latencies lat.
func Quantile(lat []time.Duration, q float64) time.Duration {
	return lat[int(q*float64(len(lat)-1))]
}

// ReportHandoff reports the median and the 99th percentile of the sorted
// hand-off latencies lat in milliseconds (p50-ms, p99-ms) and returns them,
// for the backend's ratios to its own round trips. With no latencies it
// reports nothing and returns ok false.
func ReportHandoff(b *testing.B, lat []time.Duration) (p50, p99 time.Duration, ok bool) {
	if len(lat) == 0 {
		return 0, 0, false
	}
	p50, p99 = Quantile(lat, 0.5), Quantile(lat, 0.99)
	b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
	return p50, p99, true
}

// Hold claims n sessions with claim, lets one renew interval pass (the
// acquisitions settle into one renewal batch), calls mark, then sleeps b.N
// intervals: the benchmark's iterations, with the timer running. It fails
// the benchmark if a session was lost, and returns the number of intervals
// that passed after mark.
func Hold(b *testing.B, n int, interval time.Duration, claim func(i int) (core.Session, error), mark func()) float64 {
	b.Helper()
	sessions := make([]core.Session, n)
	for i := range sessions {
		s, err := claim(i)
		if err != nil {
			b.Fatal(err)
		}
		sessions[i] = s
	}
	time.Sleep(interval) // a settling window, not synchronisation
	mark()
	start := time.Now()
	b.ResetTimer()
	for range b.N {
		time.Sleep(interval)
	}
	b.StopTimer()
	intervals := time.Since(start).Seconds() / interval.Seconds()
	for _, s := range sessions {
		if s.Err() != nil {
			b.Fatalf("session lost: %v", s.Err())
		}
	}
	return intervals
}
