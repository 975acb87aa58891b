package gocronlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/dislock/dislock/integrations/gocronlock"
)

// gocron v2.21.2's TestScheduler_WithDistributed ("3 schedulers with
// elector", scheduler_test.go), on dislock's Elector instead of gocron's
// test elector: three schedulers, one Elector each created just before its
// scheduler starts, one job that starts immediately and runs once. The
// first run must happen on exactly one scheduler: an IsLeader that answers
// "not leader" while the first campaign is still in flight makes every
// scheduler skip it. The interval is an hour instead of gocron's second, so
// that a skipped first run cannot be made up by the next tick: the bound
// on the run is then generous without hiding the fault.
func TestGocronWithDistributedElector(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		const count = 3
		jobsRan := make(chan struct{}, 20)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		schedulersDone := make(chan error, count)
		for range count {
			el, err := gocronlock.NewElector(e.locker(t), "distributed")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = el.Close() })
			s, err := gocron.NewScheduler(gocron.WithDistributedElector(el), gocron.WithStopTimeout(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			go func() {
				s.Start()
				_, err := s.NewJob(
					gocron.DurationJob(time.Hour),
					gocron.NewTask(func() {
						time.Sleep(100 * time.Millisecond)
						jobsRan <- struct{}{}
					}),
					gocron.WithStartAt(gocron.WithStartImmediately()),
					gocron.WithLimitedRuns(1),
				)
				if err != nil {
					_ = s.Shutdown()
					schedulersDone <- err
					return
				}
				<-ctx.Done()
				schedulersDone <- s.Shutdown()
			}()
		}
		select {
		case <-jobsRan:
		case <-time.After(10 * time.Second):
			t.Error("timed out waiting for the job to run: every scheduler skipped its first run")
		}
		cancel()
		for range count {
			select {
			case err := <-schedulersDone:
				if err != nil {
					t.Errorf("scheduler: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("timed out waiting for schedulers to shut down")
			}
		}
		if n := len(jobsRan); n != 0 {
			t.Errorf("%d more runs, want the job to run on one scheduler only", n)
		}
	})
}
