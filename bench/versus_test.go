package bench

import (
	"context"
	"fmt"
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
// distinct keys (at least 1).
func BenchmarkVersus(b *testing.B) {
	for _, s := range stores {
		for _, peer := range []string{versusPeers[s], versusAlso[s]} {
			if peer == "" {
				continue
			}
			b.Run(s+"/uncontended-vs-"+peer, func(b *testing.B) { versusUncontended(b, s, peer) })
			b.Run(s+"/distinct-vs-"+peer, func(b *testing.B) { versusDistinct(b, s, peer) })
		}
	}
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
