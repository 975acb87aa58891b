package core_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
)

// stallBackend wraps a memlock handle: renewals that carry a key in stall
// hang until their ctx ends, while every other call goes through (a slow
// key, or a slow store, rather than a dead one). It checks that no key is
// in two renewals at once.
type stallBackend struct {
	*memlock.Backend
	stall sync.Map // key -> struct{}

	mu       sync.Mutex
	inflight map[string]bool
	overlaps int
}

func (b *stallBackend) Renew(ctx context.Context, reqs []core.RenewRequest) ([]error, error) {
	b.mu.Lock()
	for _, r := range reqs {
		if b.inflight[r.Key] {
			b.overlaps++
		}
		b.inflight[r.Key] = true
	}
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		for _, r := range reqs {
			delete(b.inflight, r.Key)
		}
		b.mu.Unlock()
	}()
	for _, r := range reqs {
		if _, ok := b.stall.Load(r.Key); ok {
			<-ctx.Done()
			return nil, ctx.Err()
		}
	}
	return b.Backend.Renew(ctx, reqs)
}

func newStall(t *testing.T, st *memlock.Store, opts ...core.ClientOption) (*core.Client, *stallBackend) {
	t.Helper()
	sb := &stallBackend{Backend: st.Backend(), inflight: make(map[string]bool)}
	return newClient(t, sb, opts...), sb
}

// A loss at the renew deadline leaves the key to the holder until the TTL:
// the engine never frees it on its own. Only the holder's Release (its work
// has stopped) frees it early.
func TestLossKeepsTheMargin(t *testing.T) {
	for _, release := range []bool{false, true} {
		t.Run(fmt.Sprint("release=", release), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := memlock.NewStore()
				a, sb := newStall(t, st, core.WithDefaults(core.TTL(30*time.Second)))
				b := newClient(t, st.Backend())
				start := time.Now()
				s := hold(t, a, "k")
				sb.stall.Store("k", struct{}{}) // renewals hang; releases go through
				got := make(chan time.Duration, 1)
				go func() {
					s2, err := b.Acquire(context.Background(), "k")
					if err != nil {
						t.Error(err)
						got <- 0
						return
					}
					got <- time.Since(start)
					s2.Release(context.Background())
				}()
				<-s.Done()
				if lost := time.Since(start); lost != 20*time.Second {
					t.Fatalf("lost after %v, want the 20s renew deadline", lost)
				}
				if !errors.Is(s.Err(), core.ErrLeaseLost) || errors.Is(s.Err(), core.ErrLeaseGone) {
					t.Fatalf("Err = %v, want ErrLeaseLost and not ErrLeaseGone", s.Err())
				}
				want := 30 * time.Second // the TTL from the acquire's send time
				if release {
					time.Sleep(5 * time.Second) // the holder's work takes 5s to stop
					if err := s.Release(context.Background()); err != nil {
						t.Fatalf("Release of the lost session: %v", err)
					}
					want = 25 * time.Second
				}
				// The waiter wakes 1ms after the holder's known expiry.
				if at := <-got; at < want || at > want+10*time.Millisecond {
					t.Fatalf("the next holder acquired at %v, want %v", at, want)
				}
			})
		})
	}
}

// One key whose renewals hang holds up no other lease: a 3s lease stays
// held for 30 of its TTLs beside a 300s lease whose every renewal hangs.
func TestHangingKeyDoesNotStarveOthers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memlock.NewStore()
		c, sb := newStall(t, st)
		a := hold(t, c, "a", core.TTL(300*time.Second))
		sb.stall.Store("a", struct{}{})
		b := hold(t, c, "b", core.TTL(3*time.Second))
		// And a third lease that is due together with a's renewals.
		time.Sleep(99*time.Second + 900*time.Millisecond)
		c3 := hold(t, c, "c", core.TTL(3*time.Second))
		time.Sleep(90 * time.Second)
		for _, s := range []core.Session{b, c3} {
			if s.Err() != nil {
				t.Fatalf("lease %q lost beside a hanging key: %v", s.Key(), s.Err())
			}
		}
		<-a.Done() // a itself is lost at its own deadline
		sb.mu.Lock()
		defer sb.mu.Unlock()
		if sb.overlaps != 0 {
			t.Fatalf("%d renewals carried a key already in flight", sb.overlaps)
		}
	})
}

// When nothing hangs, many leases still cost one renewal call per interval.
func TestRenewalBatchesWhenNothingHangs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memlock.NewStore()
		bk := st.Backend()
		c := newClient(t, bk, core.WithDefaults(core.TTL(30*time.Second)))
		holdN(t, c, "k", 100)
		before := bk.Stats().Renews
		time.Sleep(100 * time.Second)
		if n := bk.Stats().Renews - before; n < 9 || n > 11 {
			t.Fatalf("%d renewal calls in 10 intervals for 100 leases, want 10", n)
		}
	})
}

// A Resign while not leading is a no-op: the next win does not resign.
func TestStaleResignIsDropped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cs, _ := newPair(t, core.WithDefaults(core.TTL(30*time.Second)))
		holder := hold(t, cs[1], "leader")
		var revoked atomic.Int32
		e, err := core.CampaignContext(context.Background(), cs[0], "leader", core.WithRetry(time.Second),
			core.OnRevoked(func(error) { revoked.Add(1) }))
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		synctest.Wait()
		e.Resign() // not leading: nothing to resign
		holder.Release(context.Background())
		synctest.Wait()
		time.Sleep(10 * time.Second)
		if !e.IsLeader() || revoked.Load() != 0 {
			t.Fatalf("leader %v, revoked %d times: a stale Resign ended the next term", e.IsLeader(), revoked.Load())
		}
	})
}

// A Resign that races the loss of a term does not carry over to the next.
func TestResignRacingLossDoesNotCarryOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cs, bs := newPair(t, core.WithDefaults(core.TTL(30*time.Second)))
		var elected atomic.Int32
		e, err := core.CampaignContext(context.Background(), cs[0], "leader", core.WithRetry(time.Second),
			core.OnElected(func(core.Session) { elected.Add(1) }))
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		synctest.Wait()
		s := e.Session()
		if s == nil {
			t.Fatal("not elected")
		}
		bs[0].SetDown(true)
		<-s.Done()
		e.Resign() // too late for the lost term
		bs[0].SetDown(false)
		time.Sleep(40 * time.Second) // the key expires; the campaign wins again
		if !e.IsLeader() || elected.Load() != 2 {
			t.Fatalf("leader %v after %d elections: the late Resign ended the next term", e.IsLeader(), elected.Load())
		}
		time.Sleep(30 * time.Second)
		if !e.IsLeader() {
			t.Fatal("leadership flapped")
		}
	})
}

// watchMode makes a memlock handle's Watch unsupported, failing, or silent
// (subscribed, but no notification ever arrives).
type watchMode struct {
	*memlock.Backend
	mode string
}

func (w *watchMode) Watch(ctx context.Context, ready func(), fn func(string)) error {
	switch w.mode {
	case "unsupported":
		return core.ErrUnsupported
	case "failing":
		return errors.New("subscription refused")
	}
	ready()
	<-ctx.Done()
	return ctx.Err()
}

// Own releases are remembered as echoes only while a subscription can bring
// them back, and never beyond a small bound.
func TestEchoMemoryBounded(t *testing.T) {
	for _, mode := range []string{"unsupported", "failing", "silent"} {
		t.Run(mode, func(t *testing.T) {
			st := memlock.NewStore()
			c := newClient(t, &watchMode{Backend: st.Backend(), mode: mode})
			other, _ := st.Locker()
			defer other.Close()
			busy := hold(t, other, "busy")
			defer busy.Release(context.Background())
			// A waiter starts the watcher.
			ctx, cancel := context.WithCancel(context.Background())
			waited := make(chan struct{})
			go func() {
				defer close(waited)
				c.Acquire(ctx, "busy", core.Backoff(time.Second, time.Second))
			}()
			defer func() { cancel(); <-waited }()
			for i := range 10000 {
				s := hold(t, c, fmt.Sprint("k", i%100))
				if err := s.Release(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			limit := 8 * 100 // a few per key, while subscribed
			if mode != "silent" {
				limit = 0
			}
			if n := core.EchoCount(c); n > limit {
				t.Fatalf("%d echoes remembered after 10,000 releases on 100 keys, want at most %d", n, limit)
			}
		})
	}
}

func TestAcquireTimeoutNamesTheHolder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cs, _ := newPair(t, core.WithDefaults(core.TTL(30*time.Second)))
		s := hold(t, cs[0], "k", core.WithOwner("host:123"))
		defer s.Release(context.Background())
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := cs[1].Acquire(ctx, "k")
		want := fmt.Sprintf(`dislock: lock "k" not acquired within 2s: held by "host:123" (token %d) for 28s more: context deadline exceeded`, s.Token())
		if err == nil || err.Error() != want {
			t.Fatalf("got  %v\nwant %s", err, want)
		}
		var na *core.NotAcquiredError
		if !errors.As(err, &na) || na.Holder == nil || na.Holder.Owner != "host:123" || na.Waited != 2*time.Second {
			t.Fatalf("errors.As: %+v", na)
		}
		if !errors.Is(err, core.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%v does not match ErrNotAcquired and DeadlineExceeded", err)
		}
		// Cancelled before any answer (during the jitter): one line, and
		// not busy: the store said nothing.
		ctx2, cancel2 := context.WithCancel(context.Background())
		cancel2()
		_, err = cs[1].Acquire(ctx2, "k", core.Jitter(time.Second))
		if err == nil || strings.Contains(err.Error(), "\n") || !errors.Is(err, context.Canceled) || errors.Is(err, core.ErrNotAcquired) {
			t.Fatalf("cancelled before the first attempt: %q", err)
		}
	})
}

// lateClaim wraps a memlock handle whose claims time out on the client but
// land in the store 2s later, after the first undo: a statement that runs on
// in the server. It bounds that delay with ClaimBound.
type lateClaim struct {
	*memlock.Backend
	late atomic.Bool
	wg   sync.WaitGroup
}

func (b *lateClaim) ClaimBound() time.Duration { return 5 * time.Second }

func (b *lateClaim) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	if !b.late.Load() {
		return b.Backend.TryAcquire(ctx, req)
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		time.Sleep(2 * time.Second)
		b.Backend.TryAcquire(context.Background(), req)
	}()
	return core.Lease{}, context.DeadlineExceeded
}

func TestUndoRepeatedAfterClaimBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memlock.NewStore()
		lb := &lateClaim{Backend: st.Backend()}
		c := newClient(t, lb, core.WithDefaults(core.TTL(30*time.Second)))
		lb.late.Store(true)
		if _, err := c.TryAcquire(context.Background(), "k"); err == nil {
			t.Fatal("TryAcquire succeeded")
		}
		time.Sleep(3 * time.Second)
		if !st.Held("k") {
			t.Fatal("the late claim did not land (test setup)")
		}
		time.Sleep(3 * time.Second) // past the 5s claim bound
		if st.Held("k") {
			t.Fatal("the claim that landed after the first undo is still held")
		}
		lb.wg.Wait()
	})
}

// Close does not cut short the undo owed after the claim bound.
func TestCloseWaitsForClaimBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memlock.NewStore()
		lb := &lateClaim{Backend: st.Backend()}
		c, err := core.New(lb, core.WithDefaults(core.TTL(30*time.Second)))
		if err != nil {
			t.Fatal(err)
		}
		lb.late.Store(true)
		start := time.Now()
		if _, err := c.TryAcquire(context.Background(), "k"); err == nil {
			t.Fatal("TryAcquire succeeded")
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != 5*time.Second {
			t.Fatalf("Close returned after %v, want at the 5s claim bound", d)
		}
		lb.wg.Wait()
		if st.Held("k") {
			t.Fatal("the claim that landed after the first undo outlived Close")
		}
	})
}

// A waiting Acquire rides out a store outage: it keeps trying until the
// store is back and the lock is free, and a ctx that ends during the outage
// reports the last failure, not busy.
func TestAcquireWaitsThroughStoreFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cs, bs := newPair(t, core.WithDefaults(core.TTL(30*time.Second)))
		h := hold(t, cs[0], "k")
		bs[1].SetDown(true)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := cs[1].Acquire(ctx, "k")
		if errors.Is(err, core.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, memlock.ErrUnavailable) {
			t.Fatalf("Acquire during an outage = %v, want DeadlineExceeded and the store's failure, not ErrNotAcquired", err)
		}
		got := make(chan error, 1)
		go func() {
			s, err := cs[1].Acquire(context.Background(), "k", core.Backoff(100*time.Millisecond, time.Second))
			if err == nil {
				s.Release(context.Background())
			}
			got <- err
		}()
		time.Sleep(5 * time.Second)
		bs[1].SetDown(false)
		h.Release(context.Background())
		if err := <-got; err != nil {
			t.Fatalf("Acquire did not ride out the outage: %v", err)
		}
		// Errors no retry can mend end the wait at once.
		if _, err := cs[1].Acquire(context.Background(), "k", core.TTL(-1)); !errors.Is(err, core.ErrInvalidOption) {
			t.Fatalf("bad option: %v", err)
		}
	})
}

// failBackend fails, after 200ms, every renewal call that carries a key in
// bad: a timeout raised by the store or the driver, not by the engine.
type failBackend struct {
	*memlock.Backend
	bad sync.Map
}

func (b *failBackend) Renew(ctx context.Context, reqs []core.RenewRequest) ([]error, error) {
	for _, r := range reqs {
		if _, ok := b.bad.Load(r.Key); ok {
			time.Sleep(200 * time.Millisecond)
			return nil, errors.New("canceling statement due to statement timeout")
		}
	}
	return b.Backend.Renew(ctx, reqs)
}

// A key whose every renewal call fails on the store's side (its own
// timeout) is split away from the healthy leases batched with it.
func TestFailingKeyIsSplitAway(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memlock.NewStore()
		fb := &failBackend{Backend: st.Backend()}
		c := newClient(t, fb, core.WithDefaults(core.TTL(3*time.Second)))
		ok := holdN(t, c, "ok", 5)
		bad := hold(t, c, "bad")
		fb.bad.Store("bad", struct{}{})
		time.Sleep(30 * time.Second) // 10 TTLs
		for _, s := range ok {
			if s.Err() != nil {
				t.Fatalf("healthy lease %q lost beside a key the store fails: %v", s.Key(), s.Err())
			}
		}
		if bad.Err() == nil {
			t.Fatal("the failing lease was not lost")
		}
	})
}

// A short stall of the whole store costs a few extra calls, not one per
// lease, and no lease.
func TestStoreStallDoesNotFanOutPerLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memlock.NewStore()
		bk := st.Backend()
		c := newClient(t, bk, core.WithDefaults(core.TTL(30*time.Second)))
		ss := holdN(t, c, "k", 200)
		time.Sleep(9 * time.Second)
		before := bk.Stats().Renews
		bk.SetLatency(time.Minute) // the renewal sent at 10s hangs
		time.Sleep(3 * time.Second)
		bk.SetLatency(0) // the store answers again; the hung call times out at 15s
		time.Sleep(8 * time.Second)
		if n := bk.Stats().Renews - before; n > 1+splitWays {
			t.Fatalf("%d renewal calls for 200 leases around one stall, want at most %d", n, 1+splitWays)
		}
		for _, s := range ss {
			if s.Err() != nil {
				t.Fatalf("lease %q lost to a 5s stall: %v", s.Key(), s.Err())
			}
		}
	})
}

const splitWays = 16

// A waiting Acquire during an outage leaves no goroutine per attempt, and
// its undos cost about one release per attempt, not one per attempt per
// backoff step.
func TestOutageUndosStayBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cs, bs := newPair(t, core.WithDefaults(core.TTL(30*time.Second)))
		h := hold(t, cs[0], "k")
		defer h.Release(context.Background())
		bs[1].SetDown(true)
		base := runtime.NumGoroutine()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		for range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cs[1].Acquire(ctx, "k", core.Backoff(10*time.Millisecond, time.Second))
			}()
		}
		time.Sleep(19 * time.Second)
		if n := runtime.NumGoroutine() - base; n > 40 {
			t.Fatalf("%d goroutines for 20 waiters during an outage", n)
		}
		wg.Wait()
		st := bs[1].Stats()
		if st.Releases > 2*st.Acquires+100 {
			t.Fatalf("%d releases for %d acquire attempts during an outage", st.Releases, st.Acquires)
		}
		bs[1].SetDown(false)
	})
}

// Leases taken over most of an interval share one renewal call per interval
// from the first renewal on: the later ones ride along early rather than
// costing a call of their own.
func TestRenewalOfSpreadLeasesIsOneCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cs, bs := newPair(t, core.WithDefaults(core.TTL(30*time.Second)))
		bk := bs[0]
		start := time.Now()
		for i := range 40 {
			if _, err := cs[0].TryAcquire(context.Background(), fmt.Sprint("k", i)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond) // acquisitions spread over 8s of the 10s interval
		}
		// Up to just before the third interval's renewal: two calls (at
		// 10s and 20s), not three (10s, then 15.2s for the later leases,
		// which pulls the earlier ones in, then 25.2s).
		time.Sleep(start.Add(29*time.Second + 500*time.Millisecond).Sub(time.Now()))
		st1 := bk.Stats()
		if st1.Renews != 2 {
			t.Fatalf("%d renewal calls in the first 29.5s of 40 leases taken over 8s (interval 10s), want 2", st1.Renews)
		}
		if st1.RenewedLeases != 80 {
			t.Fatalf("%d leases renewed by 2 calls, want 80 (every lease each time)", st1.RenewedLeases)
		}
	})
}

// slowFailBackend fails its first renewal call after wait (a bound of the
// backend's own, shorter than the engine's) and records the send time of
// every renewal call.
type slowFailBackend struct {
	*memlock.Backend
	wait time.Duration
	mu   sync.Mutex
	sent []time.Time
	done []time.Time
}

func (b *slowFailBackend) Renew(ctx context.Context, reqs []core.RenewRequest) ([]error, error) {
	b.mu.Lock()
	b.sent = append(b.sent, time.Now())
	first := len(b.sent) == 1
	b.mu.Unlock()
	if first {
		time.Sleep(b.wait)
		b.mu.Lock()
		b.done = append(b.done, time.Now())
		b.mu.Unlock()
		return nil, errors.New("rpc error: code = Unavailable desc = connection reset by peer")
	}
	return b.Backend.Renew(ctx, reqs)
}

// Retries of a renewal are spaced from the failed call's send: a call that
// failed after a wait longer than the retry delay (a backend's own attempt
// bound, a connection's timeout) is retried at once, so that a retry still
// fits before the renew deadline when the next attempt is slow too.
func TestRenewalRetrySpacedFromSend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memlock.NewStore()
		// TTL 30s: renewals every 10s, the engine's bound on the first
		// call 5s, retries 1.5s to 4.5s apart; the call fails after 4.8s.
		fb := &slowFailBackend{Backend: st.Backend(), wait: 4800 * time.Millisecond}
		c := newClient(t, fb, core.WithDefaults(core.TTL(30*time.Second)))
		s := hold(t, c, "k")
		time.Sleep(15 * time.Second)
		fb.mu.Lock()
		sent, done := fb.sent, fb.done
		fb.mu.Unlock()
		if len(sent) < 2 || len(done) != 1 {
			t.Fatalf("renewal calls sent at %v, failed at %v: want the failed call and its retry", sent, done)
		}
		if gap := sent[1].Sub(done[0]); gap != 0 {
			t.Errorf("retry sent %v after the failed call returned, %v after its send; want at once", gap, sent[1].Sub(sent[0]))
		}
		if s.Err() != nil {
			t.Fatal(s.Err())
		}
	})
}
