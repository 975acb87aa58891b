package core_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
)

// notBusy fails t unless err is a failure that matches every error in
// want and not ErrNotAcquired, and is not a *NotAcquiredError.
func notBusy(t *testing.T, what string, err error, want ...error) {
	t.Helper()
	var na *core.NotAcquiredError
	if err == nil || errors.Is(err, core.ErrNotAcquired) || errors.As(err, &na) {
		t.Fatalf("%s = %v, want a failure that does not match ErrNotAcquired", what, err)
	}
	for _, w := range want {
		if !errors.Is(err, w) {
			t.Fatalf("%s = %v, want it to match %v", what, err, w)
		}
	}
	if strings.Contains(err.Error(), "\n") {
		t.Fatalf("%s: the message spans lines: %q", what, err)
	}
}

// ErrNotAcquired is the store's answer "held by someone else" and nothing
// else: a store that fails or does not answer in time never reads as busy.
func TestOutageIsNotBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cs, bs := newPair(t, core.WithDefaults(core.TTL(30*time.Second)))

		// A TryAcquire whose ctx ends while the store is slow.
		bs[1].SetLatency(5 * time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := cs[1].TryAcquire(ctx, "k")
		cancel()
		notBusy(t, "TryAcquire on a slow store", err, context.DeadlineExceeded)
		if core.ErrorType(err) != "deadline_exceeded" {
			t.Errorf("ErrorType = %q, want deadline_exceeded", core.ErrorType(err))
		}

		// A TryAcquire on a store that fails at once.
		bs[1].SetLatency(0)
		bs[1].SetDown(true)
		_, err = cs[1].TryAcquire(context.Background(), "k")
		notBusy(t, "TryAcquire on a down store", err, memlock.ErrUnavailable)

		// An Acquire during an outage: the deadline and the store's failure.
		ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
		_, err = cs[1].Acquire(ctx, "k")
		cancel()
		notBusy(t, "Acquire during an outage", err, context.DeadlineExceeded, memlock.ErrUnavailable)
		if want := `dislock: acquire "k" failed after 2s: context deadline exceeded: dislock: memory: acquire "k": `; !strings.HasPrefix(err.Error(), want) {
			t.Errorf("got  %v\nwant %s…", err, want)
		}

		// An Acquire on a store that hangs.
		bs[1].SetDown(false)
		bs[1].SetLatency(time.Minute)
		ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
		_, err = cs[1].Acquire(ctx, "k")
		cancel()
		notBusy(t, "Acquire on a store that hangs", err, context.DeadlineExceeded)
		bs[1].SetLatency(0)
	})
}

// A wait that saw the key busy and then lost the store reports the
// failure, and says that the key was busy before; a wait whose last answer
// was busy matches ErrNotAcquired even after failures.
func TestAcquireLastWordDecides(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cs, bs := newPair(t, core.WithDefaults(core.TTL(30*time.Second)))
		h, err := cs[0].TryAcquire(context.Background(), "k", core.WithOwner("host:1"))
		if err != nil {
			t.Fatal(err)
		}
		defer h.Release(context.Background())

		// Busy, then the store goes down for the rest of the wait.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		go func() {
			time.Sleep(500 * time.Millisecond)
			bs[1].SetDown(true)
		}()
		_, err = cs[1].Acquire(ctx, "k", core.Backoff(100*time.Millisecond, 100*time.Millisecond))
		notBusy(t, "Acquire that lost the store after a busy answer", err, context.DeadlineExceeded, memlock.ErrUnavailable)
		if !strings.Contains(err.Error(), `(the store had answered busy before: held by "host:1"`) {
			t.Errorf("the message does not say the key was busy before: %v", err)
		}

		// Down first, then busy until the deadline: busy.
		ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		go func() {
			time.Sleep(500 * time.Millisecond)
			bs[1].SetDown(false)
		}()
		_, err = cs[1].Acquire(ctx, "k", core.Backoff(100*time.Millisecond, 100*time.Millisecond))
		var na *core.NotAcquiredError
		if !errors.Is(err, core.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &na) {
			t.Fatalf("Acquire whose last answer was busy = %v, want ErrNotAcquired and DeadlineExceeded", err)
		}
		if errors.Is(err, memlock.ErrUnavailable) {
			t.Errorf("an earlier failure is reported although the last answer was busy: %v", err)
		}
	})
}

// A ctx that is already done costs no round trip, and its error is not
// busy; nor is a wait that ctx ends during the jitter, before any attempt.
func TestDoneContextCostsNoRoundTrip(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cs, bs := newPair(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		for name, acquire := range map[string]func(context.Context, string, ...core.Option) (core.Session, error){
			"TryAcquire": cs[1].TryAcquire, "Acquire": cs[1].Acquire,
		} {
			_, err := acquire(ctx, "k")
			notBusy(t, name+" with a done ctx", err, context.Canceled)
		}
		if st := bs[1].Stats(); st != (memlock.Stats{}) {
			t.Fatalf("a done ctx cost store calls: %+v", st)
		}
		ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err := cs[1].Acquire(ctx, "k", core.Jitter(time.Hour))
		notBusy(t, "Acquire ended in its jitter", err, context.DeadlineExceeded)
		if want := `dislock: acquire "k" not tried after 100ms: context deadline exceeded`; err.Error() != want {
			t.Errorf("got  %v\nwant %s", err, want)
		}
	})
}
