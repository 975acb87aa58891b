package gocronlock_test

import (
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jonboulle/clockwork"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// offsetClocks drives one fake clock per scheduler so that each reads the
// real time plus its own offset. Schedulers on them fire their ticks that far
// apart in real time, as schedulers on machines whose clocks disagree do,
// while the lock store keeps the real time.
type offsetClocks struct {
	clocks []*clockwork.FakeClock
	offs   []time.Duration
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once
}

func startClocks(t *testing.T, offs ...time.Duration) *offsetClocks {
	t.Helper()
	c := &offsetClocks{offs: offs, stop: make(chan struct{}), done: make(chan struct{})}
	now := time.Now()
	for _, off := range offs {
		c.clocks = append(c.clocks, clockwork.NewFakeClockAt(now.Add(off)))
	}
	go c.run()
	t.Cleanup(c.Stop)
	return c
}

func (c *offsetClocks) run() {
	defer close(c.done)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-tick.C:
		}
		now := time.Now()
		for i, fc := range c.clocks {
			if d := now.Add(c.offs[i]).Sub(fc.Now()); d > 0 {
				fc.Advance(d)
			}
		}
	}
}

// Stop stops advancing the clocks and waits for the driver goroutine.
func (c *offsetClocks) Stop() {
	c.once.Do(func() { close(c.stop) })
	<-c.done
}

// scheduler wraps a gocron.Scheduler so that it is shut down exactly once,
// at the latest when the test ends.
type scheduler struct {
	gocron.Scheduler
	once sync.Once
	err  error
}

func newScheduler(t *testing.T, opts ...gocron.SchedulerOption) *scheduler {
	t.Helper()
	s, err := gocron.NewScheduler(opts...)
	if err != nil {
		t.Fatalf("gocron.NewScheduler: %v", err)
	}
	w := &scheduler{Scheduler: s}
	t.Cleanup(func() { _ = w.Shutdown() })
	return w
}

func (s *scheduler) Shutdown() error {
	s.once.Do(func() { s.err = s.Scheduler.Shutdown() })
	return s.err
}

// nextSecond returns the first whole second after t.
func nextSecond(t time.Time) time.Time { return t.Truncate(time.Second).Add(time.Second) }
