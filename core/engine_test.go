package core_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
)

func TestOptionValidation(t *testing.T) {
	l := newClient(t, memlock.NewStore().Backend())
	for _, c := range []struct {
		field string
		opts  []core.Option
	}{
		{"TTL", []core.Option{core.TTL(0)}},
		{"TTL", []core.Option{core.TTL(-1)}},
		{"RenewInterval", []core.Option{core.RenewInterval(0)}},
		{"RenewInterval", []core.Option{core.TTL(9 * time.Second), core.RenewDeadline(6 * time.Second), core.RenewInterval(6 * time.Second)}},
		{"RenewInterval", []core.Option{core.TTL(9 * time.Second), core.RenewDeadline(6 * time.Second), core.RenewInterval(7 * time.Second)}},
		{"RenewDeadline", []core.Option{core.TTL(9 * time.Second), core.RenewDeadline(9 * time.Second)}},
		{"RenewDeadline", []core.Option{core.TTL(9 * time.Second), core.RenewDeadline(10 * time.Second)}},
		{"RenewDeadline", []core.Option{core.RenewDeadline(-1)}},
		{"Jitter", []core.Option{core.Jitter(-time.Second)}},
		{"MinHold", []core.Option{core.MinHold(-time.Second)}},
		{"ForSlot", []core.Option{core.ForSlot(nil)}},
		{"SlotTolerance", []core.Option{core.SlotTolerance(-1)}},
		{"Owner", []core.Option{core.WithOwner("")}},
		{"Owner", []core.Option{core.WithOwner(strings.Repeat("o", 257))}},
		{"Owner", []core.Option{core.WithOwner("a\x00b")}},
		{"Backoff", []core.Option{core.Backoff(0, time.Second)}},
		{"Backoff", []core.Option{core.Backoff(time.Second, time.Millisecond)}},
	} {
		t.Run(c.field, func(t *testing.T) {
			_, err := l.TryAcquire(context.Background(), "k", c.opts...)
			if !errors.Is(err, core.ErrInvalidOption) {
				t.Fatalf("got %v, want ErrInvalidOption", err)
			}
			if !strings.Contains(err.Error(), c.field) {
				t.Fatalf("error %q does not name %s", err, c.field)
			}
			if core.ErrorType(err) != "invalid_option" {
				t.Fatalf("ErrorType = %q", core.ErrorType(err))
			}
		})
	}
	// A bad default fails at construction.
	if _, err := memlock.New(core.WithDefaults(core.TTL(0))); !errors.Is(err, core.ErrInvalidOption) {
		t.Fatalf("New with bad default: %v", err)
	}
	if _, err := memlock.New(core.WithReleaseTimeout(0)); !errors.Is(err, core.ErrInvalidOption) {
		t.Fatalf("New with bad release timeout: %v", err)
	}
	// Options are stateless: one slice serves many acquisitions alike.
	opts := []core.Option{core.TTL(time.Minute), core.WithOwner("me")}
	for i := 0; i < 3; i++ {
		s, err := l.TryAcquire(context.Background(), fmt.Sprint("k", i), opts...)
		if err != nil || s.Owner() != "me" {
			t.Fatalf("acquisition %d: %v", i, err)
		}
		s.Release(context.Background())
	}
}

func TestValidateKey(t *testing.T) {
	for name, k := range map[string]string{
		"empty": "", "long": strings.Repeat("k", core.MaxKeyLen+1), "utf8": "\xc3\x28", "nul": "a\x00",
	} {
		if err := core.ValidateKey(k); !errors.Is(err, core.ErrInvalidKey) || !strings.Contains(err.Error(), "key") {
			t.Errorf("%s: %v", name, err)
		}
	}
	for _, k := range []string{"k", strings.Repeat("k", core.MaxKeyLen), "鍵 {x} \r\n"} {
		if err := core.ValidateKey(k); err != nil {
			t.Errorf("%q: %v", k, err)
		}
	}
}

func TestErrorType(t *testing.T) {
	for err, want := range map[error]string{
		nil:                                 "",
		core.ErrLeaseLost:                   "lease_lost",
		fmt.Errorf("x: %w", core.ErrClosed): "closed",
		fmt.Errorf("x: %w", core.ErrElectionClosed):                "election_closed",
		core.Busy("k", nil):                                        "not_acquired",
		errors.Join(core.ErrNotAcquired, context.DeadlineExceeded): "not_acquired",
		context.Canceled:                                           "canceled",
		errors.New("driver"):                                       "backend",
	} {
		if got := core.ErrorType(err); got != want {
			t.Errorf("ErrorType(%v) = %q, want %q", err, got, want)
		}
	}
}

// The engine's timing, on synctest's fake clock: renewals every TTL/3, one
// backend call per interval however many sessions, loss exactly at the
// renew deadline counted from the send time of the last good renewal.
func TestRenewalCadence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cs, bs := newPair(t, core.WithDefaults(core.TTL(30*time.Second)))
		var ss []core.Session
		for i := 0; i < 50; i++ {
			s := hold(t, cs[0], fmt.Sprint("k", i))
			ss = append(ss, s)
			time.Sleep(100 * time.Millisecond) // acquisitions spread over 5s
		}
		start := bs[0].Stats()
		time.Sleep(100 * time.Second)
		st := bs[0].Stats()
		calls := st.Renews - start.Renews
		// 100s at a 10s interval: about 10 batches, not 500 calls.
		if calls < 9 || calls > 12 {
			t.Fatalf("renew calls in 100s = %d, want about 10 (one per interval)", calls)
		}
		if per := (st.RenewedLeases - start.RenewedLeases) / calls; per < 40 {
			t.Fatalf("leases per batch = %d, want nearly all 50", per)
		}
		for _, s := range ss {
			if s.Err() != nil {
				t.Fatal(s.Err())
			}
		}
	})
}

func TestLossAtRenewDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cs, bs := newPair(t, core.WithDefaults(core.TTL(30*time.Second)))
		s := hold(t, cs[0], "k")
		acquired := time.Now()
		time.Sleep(15 * time.Second) // one renewal at 10s
		bs[0].SetDown(true)
		<-s.Done()
		lost := time.Since(acquired)
		// The last good renewal was sent at 10s; deadline = 10s + 20s.
		if lost != 30*time.Second {
			t.Fatalf("lost after %v, want exactly 30s", lost)
		}
		if !errors.Is(context.Cause(s.Context()), core.ErrLeaseLost) {
			t.Fatalf("cause %v", context.Cause(s.Context()))
		}
		// The store still had it until 10s + 30s TTL: loss came first.
		if !s.Deadline().Before(acquired.Add(40 * time.Second)) {
			t.Fatalf("deadline %v not before the store's expiry", s.Deadline().Sub(acquired))
		}
	})
}

func TestLossWhileRenewalHangs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cs, bs := newPair(t, core.WithDefaults(core.TTL(30*time.Second)))
		s := hold(t, cs[0], "k")
		acquired := time.Now()
		bs[0].SetLatency(time.Hour) // every call hangs far past the TTL
		<-s.Done()
		if lost := time.Since(acquired); lost != 20*time.Second {
			t.Fatalf("lost after %v, want exactly the 20s renew deadline", lost)
		}
		bs[0].SetLatency(0)
	})
}

// Rule: a session whose Release is still waiting for the store ends as
// lost at its local deadline, as it would have without the Release: the
// loss is signalled before the store can hand the key on.
func TestReleaseInFlightLosesAtDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cs, bs := newPair(t, core.WithDefaults(core.TTL(3*time.Second)))
		s := hold(t, cs[0], "k")
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

// A session whose Release is in flight is renewed no more: no renewal may
// follow the release.
func TestReleaseInFlightIsNotRenewed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cs, bs := newPair(t, core.WithDefaults(core.TTL(3*time.Second))) // renewals every 1s
		s := hold(t, cs[0], "k")
		time.Sleep(900 * time.Millisecond)
		renews := bs[0].Stats().Renews
		bs[0].SetLatency(10 * time.Second)
		released := make(chan error, 1)
		go func() { released <- s.Release(context.Background()) }()
		time.Sleep(time.Second) // past the renewal that was due
		if n := bs[0].Stats().Renews - renews; n != 0 {
			t.Errorf("%d renewals sent while the release was in flight", n)
		}
		bs[0].SetLatency(0)
		<-released
	})
}

func TestTransientRenewFailureIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cs, bs := newPair(t, core.WithDefaults(core.TTL(30*time.Second)))
		s := hold(t, cs[0], "k")
		time.Sleep(9 * time.Second)
		bs[0].SetDown(true) // the renewal due at 10s fails
		time.Sleep(6 * time.Second)
		bs[0].SetDown(false) // retries about every 3s succeed before 20s
		time.Sleep(60 * time.Second)
		if s.Err() != nil {
			t.Fatalf("session lost after a short outage: %v", s.Err())
		}
	})
}

func TestRefusedRenewalIsLostAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st, cs, _ := newPair(t, core.WithDefaults(core.TTL(30*time.Second)))
		s := hold(t, cs[0], "k")
		acquired := time.Now()
		st.Steal("k")
		<-s.Done()
		if lost := time.Since(acquired); lost != 10*time.Second {
			t.Fatalf("lost after %v, want at the first renewal (10s)", lost)
		}
	})
}

func TestWaiterWakesNoLaterThanExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cs, bs := newPair(t, core.WithDefaults(core.TTL(30*time.Second)))
		if _, err := cs[0].TryAcquire(context.Background(), "k"); err != nil {
			t.Fatal(err)
		}
		bs[0].SetDown(true) // the holder crashes
		start := time.Now()
		// Polling alone would wait up to an hour between attempts.
		s, err := cs[1].Acquire(context.Background(), "k", core.Backoff(time.Hour, time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d < 30*time.Second || d > 31*time.Second {
			t.Fatalf("acquired after %v, want right at the holder's 30s expiry", d)
		}
		s.Release(context.Background())
	})
}

func TestWaiterWokenByLocalRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cs, _ := newPair(t)
		s := hold(t, cs[0], "k")
		got := make(chan time.Time)
		go func() {
			s2, err := cs[0].Acquire(context.Background(), "k", core.Backoff(time.Hour, time.Hour))
			if err == nil {
				s2.Release(context.Background())
			}
			got <- time.Now()
		}()
		synctest.Wait()
		time.Sleep(time.Second)
		released := time.Now()
		s.Release(context.Background())
		if at := <-got; at.Sub(released) > time.Millisecond {
			t.Fatalf("woke %v after the release", at.Sub(released))
		}
	})
}

func TestJitterAndMinHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cs, _ := newPair(t)
		start := time.Now()
		s := hold(t, cs[0], "k", core.Jitter(5*time.Second), core.MinHold(time.Minute))
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("jitter slept %v > 5s", d)
		}
		s.Release(context.Background())
		if _, err := cs[1].TryAcquire(context.Background(), "k"); !errors.Is(err, core.ErrNotAcquired) {
			t.Fatalf("min hold not kept: %v", err)
		}
		s2, err := cs[1].Acquire(context.Background(), "k")
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d < time.Minute {
			t.Fatalf("freed after %v, min hold 1m", d)
		}
		s2.Release(context.Background())
		// Jitter honours ctx.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err = cs[0].TryAcquire(ctx, "j", core.Jitter(time.Hour))
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("jitter with ctx: %v", err)
		}
	})
}

func TestSlotEndUsesStoreClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st, cs, _ := newPair(t)
		// The store's clock runs 3s ahead of this process.
		st.SetClockOffset(3 * time.Second)
		base := time.Now().Add(3 * time.Second).Truncate(time.Minute).Add(time.Minute)
		// Fire at 0.5s before the store's minute: it belongs to the coming slot.
		time.Sleep(base.Add(-500 * time.Millisecond).Sub(time.Now().Add(3 * time.Second)))
		s := hold(t, cs[0], "k", core.ForSlot(core.Every(time.Minute)))
		// Ends at base+1m less the 1s tolerance on the store's clock, 3s
		// earlier locally.
		want := base.Add(time.Minute).Add(-time.Second).Add(-3 * time.Second)
		if got := s.Deadline(); got.Sub(want).Abs() > time.Millisecond {
			t.Fatalf("slot deadline %v, want %v", got, want)
		}
		s.Release(context.Background())
		if _, err := cs[1].TryAcquire(context.Background(), "k", core.ForSlot(core.Every(time.Minute))); !errors.Is(err, core.ErrNotAcquired) {
			t.Fatalf("a second start in the slot: %v", err)
		}
		time.Sleep(time.Until(s.Deadline())) // released, but kept until the slot ends
		s2, err := cs[1].TryAcquire(context.Background(), "k", core.ForSlot(core.Every(time.Minute)))
		if err != nil {
			t.Fatalf("next slot: %v", err)
		}
		s2.Release(context.Background())
	})
}

func TestElection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cs, bs := newPair(t, core.WithDefaults(core.TTL(30*time.Second)))
		var elected, revoked atomic.Int32
		var es [2]*core.Election
		for i := range es {
			e, err := core.CampaignContext(context.Background(), cs[i], "leader", core.WithRetry(time.Second),
				core.OnElected(func(core.Session) { elected.Add(1) }),
				core.OnRevoked(func(error) { revoked.Add(1) }))
			if err != nil {
				t.Fatal(err)
			}
			es[i] = e
			t.Cleanup(func() { e.Close() })
		}
		synctest.Wait()
		time.Sleep(time.Second)
		if es[0].IsLeader() == es[1].IsLeader() {
			t.Fatalf("leaders: %v %v, want exactly one", es[0].IsLeader(), es[1].IsLeader())
		}
		lead, standby := 0, 1
		if es[1].IsLeader() {
			lead, standby = 1, 0
		}
		info, ok, err := es[standby].Leader(context.Background())
		if err != nil || !ok || info.Token != es[lead].Session().Token() {
			t.Fatalf("Leader() = %+v %v %v", info, ok, err)
		}
		// The leader is cut off: IsLeader turns false at its deadline, and
		// the standby takes over once the TTL has run out.
		bs[lead].SetDown(true)
		deadline := es[lead].Session().Deadline()
		time.Sleep(time.Until(deadline))
		if es[lead].IsLeader() {
			t.Fatal("IsLeader still true at the local deadline")
		}
		time.Sleep(15 * time.Second)
		if !es[standby].IsLeader() {
			t.Fatal("standby did not take over within the TTL")
		}
		bs[lead].SetDown(false)
		time.Sleep(30 * time.Second) // the old leader campaigns again and subscribes
		if es[lead].IsLeader() || !es[standby].IsLeader() {
			t.Fatal("leadership changed without cause")
		}
		// Close hands over at once.
		es[standby].Close()
		synctest.Wait()
		time.Sleep(10 * time.Millisecond)
		if !es[lead].IsLeader() {
			t.Fatal("no hand-over after Close")
		}
		es[lead].Close()
		if elected.Load() != 3 || revoked.Load() != 3 {
			t.Fatalf("elected %d revoked %d, want 3 and 3", elected.Load(), revoked.Load())
		}
	})
}

func TestCloseStopsEverything(t *testing.T) {
	st := memlock.NewStore()
	c, err := st.Locker()
	if err != nil {
		t.Fatal(err)
	}
	s := hold(t, c, "k")
	// A waiter on another key is running when Close comes.
	other, _ := st.Locker()
	defer other.Close()
	h, _ := other.TryAcquire(context.Background(), "busy")
	defer h.Release(context.Background())
	errc := make(chan error)
	go func() {
		_, err := c.Acquire(context.Background(), "busy")
		errc <- err
	}()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, core.ErrClosed) {
		t.Fatalf("waiter after Close: %v", err)
	}
	if !errors.Is(s.Err(), core.ErrClosed) || st.Held("k") {
		t.Fatalf("Close left the session: %v held=%v", s.Err(), st.Held("k"))
	}
}

// Every scheduler fires a little early, tick after tick: each tick still
// gets exactly one start.
func TestSlotsWithEarlyStarts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cs, _ := newPair(t)
		sched := core.Every(time.Minute)
		opts := []core.Option{core.ForSlot(sched), core.SlotTolerance(2 * time.Second)}
		time.Sleep(time.Until(sched.Next(time.Now())))
		for tick := 0; tick < 5; tick++ {
			// Both fire 500ms before the tick, then both 500ms after it.
			next := sched.Next(time.Now())
			time.Sleep(time.Until(next.Add(-500 * time.Millisecond)))
			early, late := 0, 0
			for _, c := range cs {
				if s, err := c.TryAcquire(context.Background(), "tick", opts...); err == nil {
					early++
					s.Release(context.Background())
				}
			}
			time.Sleep(time.Second)
			for _, c := range cs {
				if s, err := c.TryAcquire(context.Background(), "tick", opts...); err == nil {
					late++
					s.Release(context.Background())
				}
			}
			if early != 1 || late != 0 {
				t.Fatalf("tick %d: %d early and %d late starts, want 1 and 0", tick, early, late)
			}
		}
	})
}

func TestValidateOptions(t *testing.T) {
	if err := core.ValidateOptions(core.TTL(time.Second), core.RenewInterval(time.Second)); !errors.Is(err, core.ErrInvalidOption) {
		t.Fatalf("ValidateOptions = %v", err)
	}
	if err := core.ValidateOptions(core.TTL(time.Second)); err != nil {
		t.Fatal(err)
	}
}

// A release wakes one waiter of a client, not all of them, and a client's
// own release is not acted on twice when the store echoes it back.
func TestWakeOneWaiterPerRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cs, bs := newPair(t)
		s := hold(t, cs[0], "k")
		const waiters = 10
		got := make(chan core.Session)
		for i := 0; i < waiters; i++ {
			go func() {
				s, err := cs[1].Acquire(context.Background(), "k", core.Backoff(time.Hour, time.Hour))
				if err != nil {
					t.Error(err)
				}
				got <- s
			}()
		}
		synctest.Wait() // all waiting after their busy attempts
		before := bs[1].Stats().Acquires
		if before < waiters {
			t.Fatalf("%d attempts before the first release, want at least %d", before, waiters)
		}
		s.Release(context.Background())
		for i := 0; i < waiters; i++ {
			s := <-got
			synctest.Wait()
			if n := bs[1].Stats().Acquires - before; n != i+1 {
				t.Fatalf("after %d hand-offs: %d attempts, want %d (one per release)", i+1, n, i+1)
			}
			s.Release(context.Background())
		}
	})
}

// A start whose clock read falls just before its slot ends but whose claim
// reaches the store after it must not start that slot a second time.
func TestSlotClaimAfterSlotEndIsRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cs, bs := newPair(t)
		opts := []core.Option{core.ForSlot(core.Every(time.Minute)), core.SlotTolerance(time.Second)}
		time.Sleep(time.Until(time.Now().Truncate(time.Minute).Add(time.Minute))) // a tick
		s := hold(t, cs[0], "k", opts...)
		s.Release(context.Background())
		end := time.Now().Add(time.Minute - time.Second) // the slot's end
		// B reads the clock 1ms before the end; its claim lands 9ms after.
		bs[1].SetLatency(10 * time.Millisecond)
		time.Sleep(time.Until(end.Add(-11 * time.Millisecond)))
		if _, err := cs[1].TryAcquire(context.Background(), "k", opts...); !errors.Is(err, core.ErrNotAcquired) {
			t.Fatalf("claim for a slot that is over: %v, want ErrNotAcquired", err)
		}
		bs[1].SetLatency(0)
		s2 := hold(t, cs[1], "k", opts...) // the next slot
		s2.Release(context.Background())
	})
}

// An acquisition whose reply comes after the renew deadline is not handed
// out as a session, and is undone on the store.
func TestAcquireReplyAfterDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st, cs, bs := newPair(t, core.WithDefaults(core.TTL(3*time.Second)))
		bs[0].SetLatency(2500 * time.Millisecond) // > 2s renew deadline
		_, err := cs[0].TryAcquire(context.Background(), "k")
		if !errors.Is(err, core.ErrLeaseLost) {
			t.Fatalf("got %v, want ErrLeaseLost", err)
		}
		bs[0].SetLatency(0)
		synctest.Wait()
		if st.Held("k") {
			t.Fatal("the late claim was left held")
		}
	})
}

// A session's Context carries the acquiring ctx's values, outlives it, and
// ends with the session's cause, whether it was asked for before the
// session ended or only after.
func TestSessionContextBeforeAndAfterEnd(t *testing.T) {
	type key struct{}
	_, cs, _ := newPair(t)
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	var ss [2]core.Session
	for i, k := range []string{"early", "late"} {
		s, err := cs[0].TryAcquire(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		ss[i] = s
	}
	early, late := ss[0], ss[1]
	ectx := early.Context()
	cancel()
	if err := ectx.Err(); err != nil {
		t.Fatalf("the session's Context ended with the acquiring ctx: %v", err)
	}
	early.Release(context.Background())
	late.Release(context.Background())
	for name, sctx := range map[string]context.Context{"asked before the end": ectx, "asked after the end": late.Context()} {
		if !errors.Is(context.Cause(sctx), core.ErrReleased) {
			t.Errorf("Context %s: cause %v, want ErrReleased", name, context.Cause(sctx))
		}
		if v := sctx.Value(key{}); v != "v" {
			t.Errorf("Context %s: value %v, want the acquiring ctx's", name, v)
		}
	}
}

// A TryAcquire of a key that a live mutex session of the same client holds
// is answered busy from that session, with no store call. A permit claim,
// another process, and the same client once the session has ended (released
// or lost) ask the store.
func TestTryAcquireOfKeyHeldHereAsksNoStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st, cs, bs := newPair(t, core.WithDefaults(core.TTL(3*time.Second)))
		ctx := context.Background()
		tries := func(i int, opts ...core.Option) (int, error) {
			before := bs[i].Stats().Acquires
			_, err := cs[i].TryAcquire(ctx, "k", opts...)
			return bs[i].Stats().Acquires - before, err
		}
		h := hold(t, cs[0], "k", core.WithOwner("host:1"))
		calls, err := tries(0)
		var busy *core.NotAcquiredError
		if !errors.As(err, &busy) || busy.Holder == nil {
			t.Fatalf("TryAcquire of a key held here: %v, want busy with the holder", err)
		}
		if got := *busy.Holder; got.Owner != "host:1" || got.Token != h.Token() || got.Remaining <= 0 || got.Remaining > 3*time.Second {
			t.Errorf("holder %+v, want owner host:1, token %d, 0 < remaining <= 3s", got, h.Token())
		}
		if calls != 0 {
			t.Errorf("TryAcquire of a key held here made %d store calls, want 0", calls)
		}
		if calls, err := tries(0, core.Limit(2)); calls != 1 || !errors.Is(err, core.ErrLimitMismatch) {
			t.Errorf("permit claim on a mutex held here: %d store calls, %v; want 1, a limit mismatch", calls, err)
		}
		if calls, err := tries(1); calls != 1 || !errors.Is(err, core.ErrNotAcquired) {
			t.Errorf("TryAcquire from another process: %d store calls, %v; want 1, busy", calls, err)
		}

		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
		before := bs[0].Stats().Acquires
		again, err := cs[0].TryAcquire(ctx, "k")
		if err != nil || bs[0].Stats().Acquires-before != 1 {
			t.Fatalf("TryAcquire after the release: %v after %d store calls; want the lock after 1", err, bs[0].Stats().Acquires-before)
		}
		st.Steal("k") // the lease is gone from the store: the next renewal loses it
		<-again.Done()
		if calls, err := tries(0); calls != 1 || !errors.Is(err, core.ErrNotAcquired) {
			t.Errorf("TryAcquire after the session was lost: %d store calls, %v; want 1, busy", calls, err)
		}
	})
}

// minHoldBackend wraps a memlock handle and records the MinHold of every
// claim.
type minHoldBackend struct {
	*memlock.Backend
	mu  sync.Mutex
	got []time.Duration
}

func (b *minHoldBackend) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	b.mu.Lock()
	b.got = append(b.got, req.MinHold)
	b.mu.Unlock()
	return b.Backend.TryAcquire(ctx, req)
}

// A claim tells the backend the session's min hold, so that a store can
// tell the waiters behind a holder whether its release frees the key at
// once; a slot's claim tells none (its session never releases).
func TestClaimCarriesMinHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &minHoldBackend{Backend: memlock.NewStore().Backend()}
		l := newClient(t, b)
		for key, opts := range map[string][]core.Option{
			"plain":    nil,
			"min-hold": {core.MinHold(time.Minute)},
			"slot":     {core.MinHold(time.Minute), core.ForSlot(core.Every(time.Hour))},
		} {
			b.mu.Lock()
			b.got = nil
			b.mu.Unlock()
			s := hold(t, l, key, opts...)
			if err := s.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
			b.mu.Lock()
			got := b.got
			b.mu.Unlock()
			want := time.Duration(0)
			if key == "min-hold" {
				want = time.Minute
			}
			if len(got) != 1 || got[0] != want {
				t.Errorf("%s: claims sent with MinHold %v, want one with %v", key, got, want)
			}
		}
	})
}
