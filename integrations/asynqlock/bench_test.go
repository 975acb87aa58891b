package asynqlock_test

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkDrain drains a backlog of N tasks on one key (a 30ms handler)
// on two servers wired as the README says, with the locks in the same Redis
// (redislock), while 20 tasks of another key are enqueued behind the
// backlog. It reports, per iteration:
//
//   - x-serial: the backlog's drain time over N × 30ms (1 is the serial,
//     handler-bound rate; 2 is half of it);
//   - other-x-serial: the same for the other key's 20 tasks (they drain
//     alongside; 1 would be as fast as one at a time), and other-tasks/s,
//     their throughput;
//   - overhead-x-rtt: the time each task of the backlog costs beyond its
//     handler, over a Redis PING round trip measured in the same run;
//   - bounces/task: busy bounces per task (of both keys).
//
// It runs against DISLOCK_TEST_REDIS:
//
//	go test -run '^$' -bench Drain -benchtime 1x ./integrations/asynqlock/
func BenchmarkDrain(b *testing.B) {
	for _, n := range []int{20, 200} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			r := newDrainRig(b)
			rtt := pingRTT(b, r)
			const m = 20
			var hot, other time.Duration
			for b.Loop() {
				h, o, _ := r.drain(n, m, time.Minute)
				hot += h
				other += o
			}
			iters := float64(b.N)
			hotMean := float64(hot) / iters
			b.ReportMetric(hotMean/float64(serial(n)), "x-serial")
			b.ReportMetric(float64(other)/iters/float64(serial(m)), "other-x-serial")
			b.ReportMetric(float64(m)/(float64(other)/iters/float64(time.Second)), "other-tasks/s")
			b.ReportMetric((hotMean/float64(n)-float64(work))/float64(rtt), "overhead-x-rtt")
			b.ReportMetric(float64(r.bounces.Load())/iters/float64(n+m), "bounces/task")
		})
	}
}

// pingRTT is the mean PING round trip to the rig's Redis.
func pingRTT(b *testing.B, r *drainRig) time.Duration {
	ctx := context.Background()
	for range 100 {
		r.e.rdb.Ping(ctx)
	}
	const n = 1000
	start := time.Now()
	for range n {
		if err := r.e.rdb.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start) / n
}
