package core_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
)

func TestSemaphorePermits(t *testing.T) {
	st := memlock.NewStore()
	ctx := context.Background()
	c := newClient(t, st.Backend())
	key := "sem"
	var last uint64
	var held []core.Session
	for range 3 {
		s := hold(t, c, key, core.Limit(3))
		if s.Token() <= last {
			t.Fatalf("token %d after %d", s.Token(), last)
		}
		last = s.Token()
		held = append(held, s)
	}
	_, err := c.TryAcquire(ctx, key, core.Limit(3))
	var na *core.NotAcquiredError
	if !errors.As(err, &na) || na.Holder == nil || na.Holder.Limit != 3 {
		t.Fatalf("4th permit: %v, want busy with the holder", err)
	}
	if _, err := c.TryAcquire(ctx, key, core.Limit(4)); !errors.Is(err, core.ErrLimitMismatch) {
		t.Fatalf("other limit: %v", err)
	}
	if _, err := c.TryAcquire(ctx, key); !errors.Is(err, core.ErrLimitMismatch) {
		t.Fatalf("mutex on a semaphore: %v", err)
	}
	hs, err := c.Holders(ctx, key)
	if err != nil || len(hs) != 3 {
		t.Fatalf("Holders: %v %v", hs, err)
	}
	for _, s := range held {
		if err := s.Check(ctx); err != nil {
			t.Fatalf("Check: %v", err)
		}
	}
	// A waiter wakes when a permit frees.
	got := make(chan error, 1)
	go func() {
		s, err := c.Acquire(ctx, key, core.Limit(3), core.Backoff(10*time.Second, 10*time.Second))
		if err == nil {
			s.Release(ctx)
		}
		got <- err
	}()
	for len(st.Waiting(key)) == 0 {
		time.Sleep(time.Millisecond)
	}
	held[0].Release(ctx)
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter not woken by a freed permit")
	}
	// A mutex on the key once the semaphore is gone.
	for _, s := range held[1:] {
		s.Release(ctx)
	}
	s := hold(t, c, key)
	if s.Token() <= last {
		t.Fatalf("mutex token %d after permits up to %d", s.Token(), last)
	}
	s.Release(ctx)
}

func TestSemaphoreUnsupported(t *testing.T) {
	c := newClient(t, plainBackend{memlock.NewStore().Backend()})
	if _, err := c.TryAcquire(context.Background(), "k", core.Limit(2)); !errors.Is(err, core.ErrUnsupported) {
		t.Fatalf("got %v", err)
	}
	if _, err := c.TryAcquire(context.Background(), "k", core.Limit(0)); !errors.Is(err, core.ErrInvalidOption) {
		t.Fatalf("Limit(0): %v", err)
	}
}

// plainBackend hides every optional interface.
type plainBackend struct{ core.Backend }

func TestCheck(t *testing.T) {
	st := memlock.NewStore()
	ctx := context.Background()
	c := newClient(t, st.Backend())
	s := hold(t, c, "check", core.TTL(3*time.Second))
	d := s.Deadline()
	time.Sleep(5 * time.Millisecond)
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if !s.Deadline().After(d) {
		t.Fatal("Check did not move the deadline")
	}
	st.Steal("check")
	if err := s.Check(ctx); !errors.Is(err, core.ErrLeaseLost) {
		t.Fatalf("Check after steal: %v", err)
	}
	select {
	case <-s.Done():
	default:
		t.Fatal("session not ended by a refused Check")
	}
}

// Acquire with a limit other than the key's holders ends at once with
// ErrLimitMismatch (no retry mends it while they hold), and the mismatch,
// which claims nothing, costs no undo Release.
func TestAcquireLimitMismatchEndsAtOnce(t *testing.T) {
	st := memlock.NewStore()
	a := newClient(t, st.Backend())
	rb := st.Backend()
	b := newClient(t, rb)
	s := hold(t, a, "k")
	defer s.Release(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err := b.Acquire(ctx, "k", core.Limit(3))
	if !errors.Is(err, core.ErrLimitMismatch) {
		t.Fatalf("Acquire = %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Acquire retried a limit mismatch for %v (until ctx ended)", d)
	}
	if st := rb.Stats(); st.Releases != 0 {
		t.Errorf("a limit mismatch, which claims nothing, was undone with %d Release calls", st.Releases)
	}
}

// Check that returns at or after the session's Deadline (the store hung)
// reports the loss: the session can no longer act as the holder.
func TestCheckPastDeadlineIsLoss(t *testing.T) {
	synctest.Test(t, checkPastDeadline)
}

func checkPastDeadline(t *testing.T) {
	st := memlock.NewStore()
	for i := range 20 {
		b := st.Backend()
		c, _ := core.New(b, core.WithDefaults(core.TTL(600*time.Millisecond)))
		s := hold(t, c, "k"+string(rune('a'+i)))
		b.SetLatency(time.Hour) // every later call hangs until its ctx ends
		err := s.Check(context.Background())
		if !errors.Is(err, core.ErrLeaseLost) {
			t.Errorf("run %d: Check returned %v after the Deadline (session Err %v), want ErrLeaseLost", i, err, s.Err())
		}
		b.SetLatency(0)
		c.Close()
	}
}
