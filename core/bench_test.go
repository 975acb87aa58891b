package core_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
	"github.com/dislock/dislock/internal/benchtest"
)

// BenchmarkTryAcquireRelease measures the engine's own cost per
// acquisition on the in-memory backend.
func BenchmarkTryAcquireRelease(b *testing.B) {
	l, err := memlock.New()
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	benchtest.TryAcquireRelease(b, l, "bench")
}

// BenchmarkHold10000 holds 10,000 sessions and reports how many backend
// renew calls one renew interval costs (the goal: 1) and the process CPU
// time per interval.
func BenchmarkHold10000(b *testing.B) {
	const n = 10000
	const ttl = 300 * time.Millisecond // renew interval 100ms
	st := memlock.NewStore()
	be := st.Backend()
	l, err := core.New(be, core.WithDefaults(core.TTL(ttl)))
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	for i := 0; i < n; i++ {
		if _, err := l.TryAcquire(ctx, fmt.Sprint("hold-", i)); err != nil {
			b.Fatal(err)
		}
	}
	time.Sleep(2 * ttl) // settle into aligned batches
	before := be.Stats()
	cpu0 := cpuTime()
	b.ResetTimer()
	for b.Loop() {
		time.Sleep(ttl / 3)
	}
	b.StopTimer()
	after := be.Stats()
	intervals := float64(b.N)
	b.ReportMetric(float64(after.Renews-before.Renews)/intervals, "renew-calls/interval")
	b.ReportMetric(float64(after.RenewedLeases-before.RenewedLeases)/intervals, "leases-renewed/interval")
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/intervals, "cpu-µs/interval")
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkIsLeader: an in-memory check, no I/O and no allocation.
func BenchmarkIsLeader(b *testing.B) {
	be := memlock.NewStore().Backend()
	e := leader(b, be)
	calls := be.Stats()
	b.ReportAllocs()
	for b.Loop() {
		if !e.IsLeader() {
			b.Fatal("not leader")
		}
	}
	b.StopTimer()
	if after := be.Stats(); after.Acquires != calls.Acquires {
		b.Fatalf("IsLeader made backend calls")
	}
}

func TestIsLeaderAllocatesNothing(t *testing.T) {
	e := leader(t, memlock.NewStore().Backend())
	if n := testing.AllocsPerRun(1000, func() { e.IsLeader() }); n != 0 {
		t.Fatalf("IsLeader allocates %v times per call", n)
	}
}

// leader campaigns for "leader" on a Locker of be and returns the election
// once it leads; both end with the test.
func leader(tb testing.TB, be core.Backend) *core.Election {
	tb.Helper()
	l, err := core.New(be)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	e, err := core.CampaignContext(context.Background(), l, "leader")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { e.Close() })
	for !e.IsLeader() {
		time.Sleep(time.Millisecond)
	}
	return e
}
