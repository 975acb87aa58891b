package bench

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"
)

// versusPeers is, per store, the peer that the goals of the uncontended
// and distinct-key benchmarks compare dislock with.
var versusPeers = map[string]string{"redis": "bsm", "pg": "ttlrow", "mysql": "ttlrow", "etcd": "mutex", "zk": "zklock"}

// versusAlso is, per store, a second peer:
// on MySQL the TTL row with a deadline on each call (see withDeadline),
// the price of a bounded call in the driver that dislock's calls pay.
var versusAlso = map[string]string{"mysql": "ttlrow-deadline"}

// BenchmarkVersus runs dislock and its store's peer (versusPeers) in one
// benchmark, in alternating rounds, so that a change of machine load
// during the run affects both alike: on a shared machine, two benchmarks
// run seconds apart can see round trips differ by half, which the x-rtt of
// BenchmarkUncontended and BenchmarkParallelDistinctKeys, each divided by
// its own round trips, carry into a comparison of the two. x-peer is
// dislock's figure divided by the peer's: for "uncontended", the time of
// one acquire + release (at most 1: as fast as the peer or faster); for
// "distinct", the rate of acquire + release pairs of 64 goroutines on
// distinct keys (at least 1); for "handoff" (etcd and ZooKeeper, see
// versusHandoff), the hand-off's p50 and p99 (at most 1).
func BenchmarkVersus(b *testing.B) {
	for _, s := range stores {
		for _, peer := range []string{versusPeers[s], versusAlso[s]} {
			if peer == "" {
				continue
			}
			b.Run(s+"/uncontended-vs-"+peer, func(b *testing.B) { versusUncontended(b, s, peer) })
			b.Run(s+"/distinct-vs-"+peer, func(b *testing.B) { versusDistinct(b, s, peer) })
			if versusHandoffs[s] {
				b.Run(s+"/handoff-vs-"+peer, func(b *testing.B) { versusHandoff(b, s, peer) })
			}
		}
	}
}

// versusHandoffs are the stores whose peer is the store's own queue recipe
// (etcd's concurrency.Mutex, zk.Lock): its waiters are told their turn, as
// dislock's are, and the hand-off's latency is the comparison. (The other
// stores' peers poll; BenchmarkHandoff shows them.)
var versusHandoffs = map[string]bool{"etcd": true, "zk": true}

// versusHandoffRound is the number of hand-offs of each contender in a
// round of versusHandoff.
const versusHandoffRound = 100

// versusHandoff is BenchmarkVersus's pair of dislock and peer on store s
// handing one key over among 16 goroutines (BenchmarkHandoff's loop), in
// alternating rounds of versusHandoffRound hand-offs, b.N of each in all.
// A round starts with every goroutine queueing at once; its first 16
// hand-offs are left out. One round of each before the timed ones warms up
// the server (a JVM compiles its request paths in the first seconds) and
// the clients.
func versusHandoff(b *testing.B, s, peer string) {
	st, _ := counted(b, s)
	ctx := bg(b)
	var (
		sets    [2][]*contender
		keys    [2]string
		samples [2][]time.Duration
	)
	for i, which := range []string{"dislock", peer} {
		sets[i] = make([]*contender, waiters)
		for g := range sets[i] {
			sets[i][g] = contenderFor(b, st, which)
		}
		keys[i] = name(which, "versus-handoff")
		if _, err := handoffs(ctx, sets[i], keys[i], versusHandoffRound, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for done := 0; done < b.N; done += versusHandoffRound {
		n := min(versusHandoffRound, b.N-done)
		for i := range sets {
			got, err := handoffs(ctx, sets[i], keys[i], n+waiters+1, nil)
			if err != nil {
				b.Fatal(err)
			}
			samples[i] = append(samples[i], got[waiters:]...)
		}
	}
	b.StopTimer()
	var p50, p99 [2]time.Duration
	for i := range samples {
		slices.Sort(samples[i])
		p50[i], p99[i] = percentile(samples[i], 50), percentile(samples[i], 99)
	}
	b.ReportMetric(ms(p50[0]), "p50-ms")
	b.ReportMetric(ms(p99[0]), "p99-ms")
	b.ReportMetric(ms(p50[1]), "peer-p50-ms")
	b.ReportMetric(ms(p99[1]), "peer-p99-ms")
	b.ReportMetric(float64(p50[0])/float64(p50[1]), "p50-x-peer")
	b.ReportMetric(float64(p99[0])/float64(p99[1]), "p99-x-peer")
}

// versusDistinct is BenchmarkVersus's pair of dislock and peer on store s
// with 64 goroutines on distinct keys.
func versusDistinct(b *testing.B, s, peer string) {
	st, _ := counted(b, s)
	var ops [2]func(ctx context.Context, w int) error
	for i, which := range []string{"dislock", peer} {
		c := parallelContenderFor(b, st, which)
		keys := make([]string, parallelism)
		for k := range keys {
			keys[k] = name(which, "versus-distinct", fmt.Sprint(k))
		}
		ops[i] = func(ctx context.Context, w int) error {
			u, err := c.try(ctx, keys[w])
			if err != nil {
				return err
			}
			return u(ctx)
		}
	}
	ctx := bg(b)
	for _, op := range ops { // warm up the pools
		if _, err := parallelRun(ctx, parallelism, 2*parallelism, op); err != nil {
			b.Fatal(err)
		}
	}
	const rounds = 4
	var took [2]time.Duration
	b.ResetTimer()
	for r := range rounds {
		n := b.N/rounds + min(1, max(0, b.N%rounds-r))
		for i, op := range ops {
			d, err := parallelRun(ctx, parallelism, max(n, parallelism), op)
			if err != nil {
				b.Fatal(err)
			}
			took[i] += d * time.Duration(n) / time.Duration(max(n, parallelism))
		}
	}
	b.ReportMetric(float64(took[1])/float64(took[0]), "x-peer")
}

// versusUncontended is BenchmarkVersus's uncontended pair of dislock and
// peer on store s.
func versusUncontended(b *testing.B, s, peer string) {
	st, _ := counted(b, s)
	ctx := bg(b)
	var ops [2]func()
	for i, which := range []string{"dislock", peer} {
		ops[i] = contenderFor(b, st, which).cycle(ctx, b, name(which, "versus"))
		ops[i]() // warm up connections and statement caches
	}
	const chunk = 50
	var took [2]time.Duration
	b.ResetTimer()
	for done := 0; done < b.N; done += chunk {
		n := min(chunk, b.N-done)
		for i, op := range ops {
			start := time.Now()
			for range n {
				op()
			}
			took[i] += time.Since(start)
		}
	}
	b.ReportMetric(float64(took[0])/float64(took[1]), "x-peer")
}
