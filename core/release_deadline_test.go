package core_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dislock/dislock/core"
)

// Rule: a session whose Release is still waiting for the store ends as
// lost at its local deadline, as it would have without the Release: the
// loss is signalled before the store can hand the key on.
func TestReleaseInFlightLosesAtDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cs, bs := newPair(t, core.WithDefaults(core.TTL(3*time.Second)))
		s, err := cs[0].TryAcquire(context.Background(), "k")
		if err != nil {
			t.Fatal(err)
		}
		deadline := s.Deadline()
		bs[0].SetLatency(10 * time.Second) // the release hangs past the deadline
		released := make(chan error, 1)
		go func() { released <- s.Release(context.Background()) }()
		<-s.Done()
		if late := time.Since(deadline); late > 0 {
			t.Errorf("session ended %v after its deadline", late)
		}
		if !errors.Is(s.Err(), core.ErrLeaseLost) || !errors.Is(context.Cause(s.Context()), core.ErrLeaseLost) {
			t.Errorf("Err = %v, cause %v: want ErrLeaseLost", s.Err(), context.Cause(s.Context()))
		}
		bs[0].SetLatency(0)
		<-released
	})
}
