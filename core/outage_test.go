package core_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
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
		h := hold(t, cs[0], "k", core.WithOwner("host:1"))
		defer h.Release(context.Background())

		// Busy, then the store goes down for the rest of the wait.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		go func() {
			time.Sleep(500 * time.Millisecond)
			bs[1].SetDown(true)
		}()
		_, err := cs[1].Acquire(ctx, "k", core.Backoff(100*time.Millisecond, 100*time.Millisecond))
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

// slack is how late after its ctx's deadline an acquisition may return
// (synctest's clock: exactly).
const slack = core.DeadlineSlack

// The caller's deadline is kept on a slow store: TryAcquire and Acquire
// return within DeadlineSlack of it, the undo of the claim cut short runs
// in the background, and the error names the caller's budget.
func TestDeadlineKeptOnSlowStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st, cs, bs := newPair(t, core.WithDefaults(core.TTL(30*time.Second)))
		bs[1].SetLatency(5 * time.Second)
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := cs[1].TryAcquire(ctx, "k")
		if d := time.Since(start); d > time.Second+slack {
			t.Fatalf("TryAcquire with a 1s deadline on a store with 5s latency returned after %v", d)
		}
		notBusy(t, "TryAcquire on a slow store", err, context.DeadlineExceeded)
		if want := `dislock: acquire "k" failed after 1s: context deadline exceeded: `; !strings.HasPrefix(err.Error(), want) {
			t.Errorf("got  %v\nwant %s…", err, want)
		}

		// A wait whose key is busy, then whose store slows down: its last
		// attempt and its leaving the store's queue are cut short too.
		h := hold(t, cs[0], "q")
		bs[1].SetLatency(0)
		ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		go func() {
			time.Sleep(time.Second)
			bs[1].SetLatency(5 * time.Second)
		}()
		start = time.Now()
		_, err = cs[1].Acquire(ctx, "q", core.Backoff(100*time.Millisecond, 100*time.Millisecond))
		if d := time.Since(start); d > 2*time.Second+slack {
			t.Fatalf("Acquire with a 2s deadline on a store that slowed down returned after %v", d)
		}
		if !errors.Is(err, core.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire whose last answer was busy = %v, want ErrNotAcquired and DeadlineExceeded", err)
		}
		if want := `dislock: lock "q" not acquired within 2s: `; !strings.HasPrefix(err.Error(), want) {
			t.Errorf("got  %v\nwant %s…", err, want)
		}
		h.Release(context.Background())
		bs[1].SetLatency(0)
		time.Sleep(10 * time.Second) // the undo and the leave, in the background
		if st.Held("k") || st.Held("q") || len(st.Waiting("q")) != 0 {
			t.Fatalf("left behind: held k %v, held q %v, waiting on q %v", st.Held("k"), st.Held("q"), st.Waiting("q"))
		}
	})
}

// freezeBackend wraps a memlock handle whose claims, while frozen, ignore
// their ctx: they wait for thaw and then reach the store all the same, as a
// driver call that does not return when its ctx ends.
type freezeBackend struct {
	*memlock.Backend
	frozen chan struct{} // nil: not frozen
	landed chan error    // the result of each frozen claim, once it lands
}

func (b *freezeBackend) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	if b.frozen == nil {
		return b.Backend.TryAcquire(ctx, req)
	}
	<-b.frozen
	lease, err := b.Backend.TryAcquire(context.WithoutCancel(ctx), req)
	b.landed <- err
	return lease, err
}

func newFrozen(t *testing.T, st *memlock.Store) (*core.Client, *freezeBackend) {
	fb := &freezeBackend{Backend: st.Backend(), frozen: make(chan struct{}), landed: make(chan error, 4)}
	c, err := core.New(fb)
	if err != nil {
		t.Fatal(err)
	}
	return c, fb
}

// A store call that ignores ctx does not keep the caller: it returns at
// the deadline plus DeadlineSlack, and the claim that lands after it left
// is undone by owner token.
func TestDeadlineKeptWhenStoreIgnoresContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memlock.NewStore()
		c, fb := newFrozen(t, st)
		defer c.Close()
		for name, acquire := range map[string]func(context.Context, string, ...core.Option) (core.Session, error){
			"TryAcquire": c.TryAcquire, "Acquire": c.Acquire,
		} {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			start := time.Now()
			_, err := acquire(ctx, "k:"+name, core.TTL(time.Minute))
			cancel()
			if d := time.Since(start); d > time.Second+slack {
				t.Fatalf("%s with a 1s deadline on a store that ignores ctx returned after %v", name, d)
			}
			notBusy(t, name+" on a store that ignores ctx", err, context.DeadlineExceeded)
			if want := `dislock: acquire "k:` + name + `" failed after 1s: context deadline exceeded: dislock: memory: acquire "k:` + name + `": no reply 100ms after the context ended`; !strings.HasPrefix(err.Error(), want) {
				t.Errorf("got  %v\nwant %s…", err, want)
			}
		}
		close(fb.frozen) // the claims land now, after their callers left
		for range 2 {
			if err := <-fb.landed; err != nil {
				t.Fatalf("the late claim failed: %v", err)
			}
		}
		synctest.Wait()
		if st.Held("k:TryAcquire") || st.Held("k:Acquire") {
			t.Fatal("a claim that landed after its caller left is still held")
		}
	})
}

// Close waits for a store call an acquisition left running, and undoes
// the claim it makes.
func TestCloseWaitsForCallLeftRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memlock.NewStore()
		c, fb := newFrozen(t, st)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, err := c.TryAcquire(ctx, "k", core.TTL(time.Minute)); err == nil {
			t.Fatal("TryAcquire on a frozen store succeeded")
		}
		go func() {
			time.Sleep(3 * time.Second)
			close(fb.frozen)
		}()
		start := time.Now()
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != 3*time.Second {
			t.Errorf("Close returned after %v, want once the call left running returned (3s)", d)
		}
		if err := <-fb.landed; err != nil {
			t.Fatalf("the late claim failed: %v", err)
		}
		if st.Held("k") {
			t.Fatal("the claim that landed during Close outlived it")
		}
	})
}

// Close cuts short an acquisition whose ctx never ends, on a store call
// that ignores ctx: it returns ErrClosed DeadlineSlack after Close began,
// and the claim that lands later is undone before Close returns.
func TestCloseCutsCallOfCtxThatNeverEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memlock.NewStore()
		c, fb := newFrozen(t, st)
		closed := make(chan error, 1)
		go func() {
			time.Sleep(time.Second)
			closed <- c.Close()
		}()
		start := time.Now()
		_, err := c.TryAcquire(context.Background(), "k", core.TTL(time.Minute))
		if !errors.Is(err, core.ErrClosed) {
			t.Fatalf("TryAcquire cut short by Close = %v, want ErrClosed", err)
		}
		if d := time.Since(start); d != time.Second+core.DeadlineSlack {
			t.Errorf("TryAcquire returned after %v, want DeadlineSlack after Close began (%v)", d, time.Second+core.DeadlineSlack)
		}
		close(fb.frozen) // the claim lands now, while Close waits for it
		if err := <-fb.landed; err != nil {
			t.Fatalf("the late claim failed: %v", err)
		}
		if err := <-closed; err != nil {
			t.Fatal(err)
		}
		if st.Held("k") {
			t.Fatal("the claim that landed during Close outlived it")
		}
	})
}

// ctxBound is a memlock handle that says whether its calls end with their
// ctx (core.ContextBound), and tells onCaller of each claim whether it was
// made on the goroutine of the test that called TryAcquire.
type ctxBound struct {
	*memlock.Backend
	ends     bool
	onCaller chan bool
}

func (b *ctxBound) EndsWithContext() bool { return b.ends }

func (b *ctxBound) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	pc := make([]uintptr, 64)
	frames := runtime.CallersFrames(pc[:runtime.Callers(1, pc)])
	caller := false
	for f, more := frames.Next(); more && !caller; f, more = frames.Next() {
		caller = strings.Contains(f.Function, "TestClaimOnCallerGoroutine")
	}
	b.onCaller <- caller
	return b.Backend.TryAcquire(ctx, req)
}

// The claims of a backend whose calls end with their ctx are made on the
// caller's goroutine, with no hand-off to a call worker; those of any other
// backend are handed to one, which the caller can leave behind. Close still
// cuts a claim of the former short, through its ctx.
func TestClaimOnCallerGoroutine(t *testing.T) {
	for _, ends := range []bool{true, false} {
		t.Run(fmt.Sprint("EndsWithContext=", ends), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := &ctxBound{Backend: memlock.NewStore().Backend(), ends: ends, onCaller: make(chan bool, 1)}
				c, err := core.New(b)
				if err != nil {
					t.Fatal(err)
				}
				s, err := c.TryAcquire(context.Background(), "k")
				if err != nil {
					t.Fatal(err)
				}
				if got := <-b.onCaller; got != ends {
					t.Errorf("claim made on the caller's goroutine: %v, want %v", got, ends)
				}
				s.Release(context.Background())

				b.SetLatency(time.Minute)
				closed := make(chan error, 1)
				go func() {
					time.Sleep(time.Second)
					closed <- c.Close()
				}()
				start := time.Now()
				_, err = c.TryAcquire(context.Background(), "k")
				took := time.Since(start)
				<-b.onCaller
				b.SetLatency(0) // for the undo of the claim cut short
				if cerr := <-closed; cerr != nil {
					t.Fatal(cerr)
				}
				if !errors.Is(err, core.ErrClosed) {
					t.Fatalf("TryAcquire cut short by Close = %v, want ErrClosed", err)
				}
				if took > time.Second+core.DeadlineSlack {
					t.Errorf("TryAcquire returned %v after Close began, want at most DeadlineSlack", took-time.Second)
				}
			})
		})
	}
}

// lateCtx is a context whose deadline (dl) passes without its timer
// ending it, as a loaded machine can run a deadline's timer late.
type lateCtx struct {
	context.Context
	dl time.Time
}

func (c lateCtx) Deadline() (time.Time, bool) { return c.dl, true }

// timeoutBackend's claims take a second and fail with a timeout of their
// own, as a dial bounded by the caller's deadline does when it passes.
type timeoutBackend struct{ core.Backend }

var errDialTimeout = errors.New("dial tcp 127.0.0.1:1: i/o timeout")

func (timeoutBackend) TryAcquire(context.Context, core.AcquireRequest) (core.Lease, error) {
	time.Sleep(time.Second)
	return core.Lease{}, errDialTimeout
}

// A claim that fails once the caller's deadline has passed reports the
// deadline beside the store's failure, even when the ctx's timer has not
// ended the ctx yet; and a ctx whose deadline has passed costs no round
// trip.
func TestDeadlinePassedBeforeItsTimer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient(t, timeoutBackend{memlock.NewStore().Backend()})
		for _, acquire := range []func(context.Context, string, ...core.Option) (core.Session, error){c.TryAcquire, c.Acquire} {
			ctx := lateCtx{context.WithoutCancel(context.Background()), time.Now().Add(500 * time.Millisecond)}
			start := time.Now()
			_, err := acquire(ctx, "k")
			notBusy(t, "an acquisition failed at its deadline", err, context.DeadlineExceeded, errDialTimeout)
			if took := time.Since(start); took != time.Second {
				t.Errorf("the acquisition returned after %v, want its one claim's 1s", took)
			}
			start = time.Now()
			_, err = acquire(ctx, "k")
			notBusy(t, "an acquisition after its deadline", err, context.DeadlineExceeded)
			if took := time.Since(start); took != 0 {
				t.Errorf("an acquisition after its deadline took %v, want no claim", took)
			}
		}
	})
}
