package redislock_test

// Benchmarks run against a private redis-server started for the benchmark
// (so INFO commandstats counts only their own commands), or against
// DISLOCK_BENCH_REDIS when set. Every benchmark measures PING in the same run
// and reports its result as a ratio to it:
//
//	go test -run '^$' -bench . -benchtime 1s ./redislock/

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/benchtest"
)

// benchRedis returns the options of the server benchmarks run against.
func benchRedis(b *testing.B) *redis.Options {
	b.Helper()
	if u := os.Getenv("DISLOCK_BENCH_REDIS"); u != "" {
		opt, err := redis.ParseURL(u)
		if err != nil {
			b.Fatal(err)
		}
		return opt
	}
	p := startPrivateRedis(b)
	return &redis.Options{Addr: p.Addr()}
}

func benchClient(b *testing.B, opt *redis.Options) *redis.Client {
	c := redis.NewClient(opt)
	b.Cleanup(func() { c.Close() })
	return c
}

// pingLatency is the mean PING round trip, serial.
func pingLatency(b *testing.B, c *redis.Client) time.Duration {
	return benchtest.Mean(b, 200, 3000, pinger(c))
}

// pinger is one PING on c.
func pinger(c *redis.Client) func() error {
	return func() error { return c.Ping(context.Background()).Err() }
}

// pingRate is PINGs per second with g goroutines.
func pingRate(b *testing.B, c *redis.Client, g int) float64 {
	return benchtest.Rate(b, g, 500*time.Millisecond, pinger(c))
}

func BenchmarkPing(b *testing.B) {
	c := benchClient(b, benchRedis(b))
	pingLatency(b, c)
	benchtest.Loop(b, pinger(c))
}

// interleaved runs op b.N times, each after one PING on c, timing both, so
// that the ratio holds under the same load (benchtest.Interleaved).
func interleaved(b *testing.B, c *redis.Client, op func() error) {
	pingLatency(b, c) // warm up
	benchtest.Interleaved(b, "ping", pinger(c), op)
}

// BenchmarkRawSetNXDel is the floor for a lock library: SET NX PX then DEL.
func BenchmarkRawSetNXDel(b *testing.B) {
	c := benchClient(b, benchRedis(b))
	ctx := context.Background()
	interleaved(b, c, func() error {
		if err := c.SetNX(ctx, "raw-lock", "v", 30*time.Second).Err(); err != nil {
			return err
		}
		return c.Del(ctx, "raw-lock").Err()
	})
}

// BenchmarkTryAcquireRelease: one uncontended TryAcquire + Release.
func BenchmarkTryAcquireRelease(b *testing.B) {
	c := benchClient(b, benchRedis(b))
	interleaved(b, c, benchtest.AcquireRelease(newLocker(b, c, "bench"), "uncontended"))
}

const parallelG = 64

// parallelClient returns a client whose pool serves parallelG goroutines,
// and its options.
func parallelClient(b *testing.B) (*redis.Client, *redis.Options) {
	opt := benchRedis(b)
	opt.PoolSize = parallelG
	return benchClient(b, opt), opt
}

// runParallel64 runs body on 64 goroutines (g numbers each) between two
// measures of c's PING rate with as many, and returns the timed operations
// per second and the mean of the two PING rates.
func runParallel64(b *testing.B, c *redis.Client, body func(pb *testing.PB, g int)) (rate, pings float64) {
	pings = pingRate(b, c, parallelG)
	b.ResetTimer()
	var next atomic.Int64
	b.SetParallelism(max(1, parallelG/runtime.GOMAXPROCS(0)))
	b.RunParallel(func(pb *testing.PB) { body(pb, int(next.Add(1))) })
	b.StopTimer()
	pings = (pings + pingRate(b, c, parallelG)) / 2
	return float64(b.N) / b.Elapsed().Seconds(), pings
}

// BenchmarkParallelDistinctKeys: 64 goroutines, each TryAcquire + Release on
// its own key. ops/ping = (pairs/s) / (PING/s with 64 goroutines).
func BenchmarkParallelDistinctKeys(b *testing.B) {
	c, _ := parallelClient(b)
	ctx := context.Background()
	l := newLocker(b, c, "bench")
	rate, pings := runParallel64(b, c, func(pb *testing.PB, g int) {
		key := fmt.Sprintf("distinct/%d", g)
		for pb.Next() {
			s, err := l.TryAcquire(ctx, key)
			if err != nil {
				b.Error(err)
				return
			}
			s.Release(ctx)
		}
	})
	b.ReportMetric(pings, "ping/s")
	b.ReportMetric(rate, "pairs/s")
	b.ReportMetric(rate/pings, "pairs/ping")
}

// BenchmarkRawParallelDistinctKeys is the same with raw SET NX PX + DEL.
func BenchmarkRawParallelDistinctKeys(b *testing.B) {
	c, _ := parallelClient(b)
	ctx := context.Background()
	rate, pings := runParallel64(b, c, func(pb *testing.PB, g int) {
		key := fmt.Sprintf("raw-distinct/%d", g)
		for pb.Next() {
			c.SetNX(ctx, key, "v", 30*time.Second)
			c.Del(ctx, key)
		}
	})
	b.ReportMetric(rate/pings, "pairs/ping")
}

// BenchmarkHotKeyFailedTries: 64 goroutines TryAcquire a key held
// elsewhere. tries/ping = (failed tries/s) / (PING/s with 64 goroutines).
func BenchmarkHotKeyFailedTries(b *testing.B) {
	c, opt := parallelClient(b)
	ctx := context.Background()
	holder := newLocker(b, benchClient(b, opt), "bench", core.TTL(time.Minute))
	s, err := holder.TryAcquire(ctx, "hot")
	if err != nil {
		b.Fatal(err)
	}
	defer s.Release(ctx)
	l := newLocker(b, c, "bench")
	rate, pings := runParallel64(b, c, func(pb *testing.PB, g int) {
		for pb.Next() {
			if _, err := l.TryAcquire(ctx, "hot"); !errors.Is(err, core.ErrNotAcquired) {
				b.Errorf("TryAcquire on a held key: %v", err)
				return
			}
		}
	})
	b.ReportMetric(rate, "tries/s")
	b.ReportMetric(rate/pings, "tries/ping")
}

// BenchmarkRawHotKeyFailedTries is the same with a raw SET NX PX.
func BenchmarkRawHotKeyFailedTries(b *testing.B) {
	c, _ := parallelClient(b)
	ctx := context.Background()
	if err := c.Set(ctx, "raw-hot", "holder", time.Minute).Err(); err != nil {
		b.Fatal(err)
	}
	rate, pings := runParallel64(b, c, func(pb *testing.PB, g int) {
		for pb.Next() {
			if ok, err := c.SetNX(ctx, "raw-hot", "me", 30*time.Second).Result(); ok || err != nil {
				b.Errorf("SET NX on a held key: %v %v", ok, err)
				return
			}
		}
	})
	b.ReportMetric(rate/pings, "tries/ping")
}

// commandCalls reads INFO commandstats: calls per command.
func commandCalls(b testing.TB, c *redis.Client) map[string]int64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
		out[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return out
}

// scriptCalls counts the scripts run (EVALSHA and EVAL) between two
// commandstats reads: the requests of this package's operations. (Commands
// called by scripts are counted by Redis too, under their own names.)
func scriptCalls(before, after map[string]int64) int64 {
	return after["evalsha"] - before["evalsha"] + after["eval"] - before["eval"]
}

// serverCalls counts every command the server ran, scripts' commands
// included, except INFO.
func serverCalls(before, after map[string]int64) int64 {
	var n int64
	for k, v := range after {
		if k != "info" {
			n += v - before[k]
		}
	}
	return n
}

// BenchmarkHandoff: 16 waiters on one key, each holding it ~1ms. Latency
// is from the start of a Release to the return of the next Acquire.
func BenchmarkHandoff(b *testing.B) {
	for _, procs := range []int{16, 1} {
		b.Run(fmt.Sprintf("lockers=%d", procs), func(b *testing.B) { benchHandoff(b, procs) })
	}
}

func benchHandoff(b *testing.B, procs int) {
	const waiters = 16
	opt := benchRedis(b)
	admin := benchClient(b, opt)
	ping := pingLatency(b, admin)
	lockers := make([]core.Locker, procs)
	for i := range lockers {
		lockers[i] = newLocker(b, benchClient(b, opt), "bench", core.TTL(10*time.Second))
	}
	before := commandCalls(b, admin)
	lat, _ := benchtest.Handoff(b, waiters, benchtest.Turns(lockers, "handoff"))
	after := commandCalls(b, admin)
	if _, _, ok := benchtest.ReportHandoff(b, lat); !ok {
		return
	}
	b.ReportMetric(float64(scriptCalls(before, after))/float64(b.N), "req/acq")
	b.ReportMetric(float64(ping.Microseconds())/1000, "ping-ms")
}

// countHook counts round trips: a command or a pipeline each.
type countHook struct{ n atomic.Int64 }

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// holdStats is what hold measured over its renew intervals.
type holdStats struct {
	intervals     float64          // renew intervals measured
	interval      time.Duration    // one renew interval
	before, after map[string]int64 // INFO commandstats calls
	trips         int64            // client round trips
	cpu           time.Duration    // the process's CPU time
}

// hold runs benchtest.Hold: one Locker (TTL 1.5s, so renewed every 500ms,
// and opts) holds n sessions, session i on key(i); it counts the server's
// commands, the client's round trips and the CPU time spent over the
// measured intervals.
func hold(b *testing.B, n int, key func(i int) string, opts ...core.Option) holdStats {
	ttl := 1500 * time.Millisecond
	st := holdStats{interval: ttl / 3}
	opt := benchRedis(b)
	admin := benchClient(b, opt)
	c := benchClient(b, opt)
	hook := &countHook{}
	c.AddHook(hook)
	l := newLocker(b, c, "bench", append([]core.Option{core.TTL(ttl)}, opts...)...)
	ctx := context.Background()
	var cpu time.Duration
	st.intervals = benchtest.Hold(b, n, st.interval, func(i int) (core.Session, error) {
		return l.TryAcquire(ctx, key(i))
	}, func() { st.before, st.trips, cpu = commandCalls(b, admin), hook.n.Load(), cpuTime() })
	st.after, st.trips, st.cpu = commandCalls(b, admin), hook.n.Load()-st.trips, cpuTime()-cpu
	return st
}

// BenchmarkHold1000: one Locker holds 1,000 leases (TTL 1.5s, renewed every
// 500ms). Each iteration is one renew interval; reported per interval:
// server commands, client round trips, and client CPU per lock·second.
func BenchmarkHold1000(b *testing.B) {
	const n = 1000
	st := hold(b, n, func(i int) string { return fmt.Sprintf("hold/%d", i) })
	b.ReportMetric(float64(scriptCalls(st.before, st.after))/st.intervals, "scripts/interval")
	b.ReportMetric(float64(serverCalls(st.before, st.after))/st.intervals, "server-cmds/interval")
	b.ReportMetric(float64(st.trips)/st.intervals, "roundtrips/interval")
	// CPU per lock and renewal; per lock·s it scales with the renewal rate
	// (at the default TTL of 30s a lease is renewed every 10s).
	perRenewal := float64(st.cpu.Nanoseconds()) / 1000 / (n * st.intervals)
	b.ReportMetric(perRenewal, "cpu-µs/renewal")
	b.ReportMetric(perRenewal/st.interval.Seconds(), "cpu-µs/lock·s")
	b.ReportMetric(perRenewal/(core.DefaultTTL/3).Seconds(), "cpu-µs/lock·s@30s")
}

// BenchmarkBackendAcquireRelease is the store's share of
// BenchmarkTryAcquireRelease: the two scripts alone, without the engine.
func BenchmarkBackendAcquireRelease(b *testing.B) {
	c := benchClient(b, benchRedis(b))
	ctx := context.Background()
	be := newBackend(b, c, "bench")
	interleaved(b, c, func() error {
		req := core.AcquireRequest{Key: "backend", Owner: "o", OwnerToken: "t", TTL: 30 * time.Second}
		if _, err := be.TryAcquire(ctx, req); err != nil {
			return err
		}
		return be.Release(ctx, core.ReleaseRequest{Key: "backend", OwnerToken: "t"})
	})
}
