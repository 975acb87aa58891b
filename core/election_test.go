package core_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
	"github.com/dislock/dislock/internal/testenv"
)

// maxTTLBackend rejects a TTL above max on acquire, as zklock does for a
// TTL its ZooKeeper session cannot carry.
type maxTTLBackend struct {
	*memlock.Backend
	max time.Duration
}

func (b maxTTLBackend) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	if req.TTL > b.max {
		return core.Lease{}, fmt.Errorf("%w: testbackend: TTL: at most %v, got %v", core.ErrInvalidOption, b.max, req.TTL)
	}
	return b.Backend.TryAcquire(ctx, req)
}

// electionLog counts an Election's callbacks.
type electionLog struct {
	mu       sync.Mutex
	elected  int
	revoked  []error
	failures []error
}

func (l *electionLog) opts() []core.ElectionOption {
	return []core.ElectionOption{
		core.OnElected(func(core.Session) { l.mu.Lock(); l.elected++; l.mu.Unlock() }),
		core.OnRevoked(func(err error) { l.mu.Lock(); l.revoked = append(l.revoked, err); l.mu.Unlock() }),
		core.OnError(func(err error) { l.mu.Lock(); l.failures = append(l.failures, err); l.mu.Unlock() }),
	}
}

func (l *electionLog) counts() (elected, revoked, failures int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.elected, len(l.revoked), len(l.failures)
}

// Rule: an option the backend rejects, and a failure no retry can mend,
// are returned by CampaignContext (and the deprecated Campaign) at once,
// with nothing left campaigning; before, Campaign returned nil and the
// campaign retried in silence forever.
func TestCampaignReturnsWhatTheBackendRejects(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memlock.NewStore()
		c := newClient(t, maxTTLBackend{st.Backend(), 26 * time.Second})
		var log electionLog
		start := time.Now()
		e, err := core.CampaignContext(context.Background(), c, "leader",
			append(log.opts(), core.WithLockOptions(core.TTL(30*time.Second)))...)
		if !errors.Is(err, core.ErrInvalidOption) || !strings.Contains(err.Error(), "TTL") || e != nil {
			t.Fatalf("CampaignContext = %v, %v; want an ErrInvalidOption naming TTL", e, err)
		}
		if d := time.Since(start); d > 100*time.Millisecond {
			t.Fatalf("rejected after %v, want at once", d)
		}
		//lint:ignore SA1019 the deprecated form must report it too
		if _, err := core.Campaign(c, "leader", core.WithLockOptions(core.TTL(30*time.Second))); !errors.Is(err, core.ErrInvalidOption) {
			t.Fatalf("Campaign = %v, want ErrInvalidOption", err)
		}
		synctest.Wait() // no campaign goroutine is left
		if el, rv, fl := log.counts(); el+rv+fl != 0 {
			t.Fatalf("callbacks ran: elected %d, revoked %d, errors %d", el, rv, fl)
		}

		// A key held as a semaphore can never be a leader lock.
		other, _ := st.Locker()
		defer other.Close()
		if _, err := other.TryAcquire(context.Background(), "sem", core.Limit(2)); err != nil {
			t.Fatal(err)
		}
		plain, _ := st.Locker()
		defer plain.Close()
		if _, err := core.CampaignContext(context.Background(), plain, "sem"); !errors.Is(err, core.ErrLimitMismatch) {
			t.Fatalf("CampaignContext on a semaphore = %v, want ErrLimitMismatch", err)
		}
		// A closed Locker.
		closed, _ := st.Locker()
		closed.Close()
		if _, err := core.CampaignContext(context.Background(), closed, "leader"); !errors.Is(err, core.ErrClosed) {
			t.Fatalf("CampaignContext on a closed Locker = %v, want ErrClosed", err)
		}
		if _, err := core.CampaignContext(context.Background(), nil, "leader"); !errors.Is(err, core.ErrInvalidOption) {
			t.Fatalf("CampaignContext(nil Locker) = %v", err)
		}
	})
}

// Rule: CampaignContext returns once the first attempt is answered, so
// IsLeader says at once what the store decided; a ctx that ends first
// leaves the campaign running in the background.
func TestCampaignWaitsForTheFirstAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cs, bs := newPair(t)
		e := campaign(t, context.Background(), cs[0], "leader")
		if !e.IsLeader() {
			t.Fatal("not leader right after CampaignContext on a free key")
		}
		standby := campaign(t, context.Background(), cs[1], "leader")
		select {
		case <-standby.Ready():
		default:
			t.Fatal("Ready not closed after a busy answer")
		}

		// A slow store: ctx ends before the first answer.
		bs[1].SetLatency(10 * time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start := time.Now()
		slow := campaign(t, ctx, cs[1], "other")
		if d := time.Since(start); d != time.Second {
			t.Fatalf("CampaignContext took %v, want the ctx's 1s", d)
		}
		select {
		case <-slow.Ready():
			t.Fatal("Ready closed before the first answer")
		default:
		}
		<-slow.Ready()
		if !slow.IsLeader() {
			t.Fatal("the campaign did not go on after ctx ended")
		}
	})
}

// Rule: every failed campaign attempt reaches OnError, a failure while
// standing by included (within one TTL), and by default the Locker's
// logger; the campaign goes on and wins once the store is back.
func TestCampaignReportsFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs testenv.SyncBuffer
		logger := slog.New(slog.NewTextHandler(&logs, nil))
		_, cs, bs := newPair(t, core.WithLogger(logger), core.WithDefaults(core.TTL(30*time.Second)))
		bs[0].SetDown(true)
		var log electionLog
		e, err := core.CampaignContext(context.Background(), cs[0], "leader", log.opts()...)
		if err != nil {
			t.Fatalf("a store failure failed CampaignContext: %v", err)
		}
		defer e.Close()
		time.Sleep(3 * time.Second)
		if _, _, fl := log.counts(); fl < 2 {
			t.Fatalf("%d failures reported in 3s of outage with a 1s retry, want 2 or more", fl)
		}
		log.mu.Lock()
		first := log.failures[0]
		log.mu.Unlock()
		if errors.Is(first, core.ErrNotAcquired) || !strings.Contains(first.Error(), "unavailable") {
			t.Fatalf("reported %v, want the store's failure", first)
		}
		bs[0].SetDown(false)
		time.Sleep(2 * time.Second)
		if !e.IsLeader() {
			t.Fatal("not leader once the store came back")
		}

		// Default: the Locker's logger. A standby whose store fails while
		// it waits reports it within one TTL.
		campaign(t, context.Background(), cs[1], "leader")
		synctest.Wait()
		bs[1].SetDown(true)
		time.Sleep(31 * time.Second)
		out := logs.String()
		if !strings.Contains(out, "campaign attempt failed") || !strings.Contains(out, "key=leader") || !strings.Contains(out, "level=WARN") {
			t.Fatalf("no failure logged through the Locker's logger; log:\n%s", out)
		}
		bs[1].SetDown(false)
	})
}

// Rule: after the Election's own Close, OnRevoked's cause is
// ErrElectionClosed, not the Locker's ErrClosed; after the Locker's Close
// it is ErrClosed.
func TestOnRevokedCauseOfClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cs, _ := newPair(t)
		var log electionLog
		e, err := core.CampaignContext(context.Background(), cs[0], "leader", log.opts()...)
		if err != nil {
			t.Fatal(err)
		}
		e.Close()
		log.mu.Lock()
		got := append([]error(nil), log.revoked...)
		log.mu.Unlock()
		if len(got) != 1 || !errors.Is(got[0], core.ErrElectionClosed) || errors.Is(got[0], core.ErrClosed) {
			t.Fatalf("OnRevoked after Election.Close: %v, want ErrElectionClosed", got)
		}

		var log2 electionLog
		campaign(t, context.Background(), cs[1], "leader", log2.opts()...)
		cs[1].Close()
		time.Sleep(2 * time.Second) // one retry pause
		log2.mu.Lock()
		defer log2.mu.Unlock()
		if len(log2.revoked) != 1 || !errors.Is(log2.revoked[0], core.ErrClosed) {
			t.Fatalf("OnRevoked after the Locker's Close: %v, want ErrClosed", log2.revoked)
		}
		// The campaign then ends, and says why.
		if len(log2.failures) != 1 || !errors.Is(log2.failures[0], core.ErrClosed) {
			t.Fatalf("OnError after the Locker's Close: %v, want ErrClosed", log2.failures)
		}
	})
}

// Rule: Observe sends the current leader, then each new one, and closes
// its channel when the Election closes.
func TestObserve(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cs, _ := newPair(t)
		a := campaign(t, context.Background(), cs[0], "leader", core.WithLockOptions(core.WithOwner("a")))
		b, err := core.CampaignContext(context.Background(), cs[1], "leader", core.WithLockOptions(core.WithOwner("b")))
		if err != nil {
			t.Fatal(err)
		}
		leaders, err := b.Observe(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if got := <-leaders; got.Owner != "a" {
			t.Fatalf("first leader %q, want a", got.Owner)
		}
		a.Close()
		start := time.Now()
		got := <-leaders
		if got.Owner == "" { // looked up between a's release and b's win
			got = <-leaders
		}
		if got.Owner != "b" || time.Since(start) > time.Second {
			t.Fatalf("next leader %q after %v, want b at once", got.Owner, time.Since(start))
		}
		b.Close()
		if got, ok := <-leaders; ok {
			t.Fatalf("channel open after Close: %+v", got)
		}
		// The channel also closes when ctx ends.
		campaign(t, context.Background(), cs[0], "leader", core.WithLockOptions(core.WithOwner("c")))
		ctx, cancel := context.WithCancel(context.Background())
		w := campaign(t, ctx, cs[1], "leader", core.WithAdmin(cs[1]))
		ch, _ := w.Observe(ctx)
		if got := <-ch; got.Owner != "c" {
			t.Fatalf("leader %q, want c", got.Owner)
		}
		cancel()
		if _, ok := <-ch; ok {
			t.Fatal("channel open after ctx ended")
		}
	})
}

// Observe needs an Admin.
func TestObserveUnsupported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, cs, _ := newPair(t)
		e := campaign(t, context.Background(), lockerOnly{cs[0]}, "leader")
		if _, err := e.Observe(context.Background()); !errors.Is(err, core.ErrUnsupported) {
			t.Fatalf("Observe without an Admin: %v", err)
		}
	})
}

// lockerOnly hides the Client's Admin.
type lockerOnly struct{ core.Locker }

// The first-round wait costs IsLeader nothing later.
func TestIsLeaderAfterReadyAllocatesNothing(t *testing.T) {
	_, cs, _ := newPair(t)
	e := campaign(t, context.Background(), cs[0], "leader")
	var leading atomic.Bool
	if n := testing.AllocsPerRun(1000, func() {
		select {
		case <-e.Ready():
		default:
		}
		leading.Store(e.IsLeader())
	}); n != 0 {
		t.Fatalf("Ready+IsLeader allocate %v times per call", n)
	}
}

// failingBackend fails every claim with err, claiming nothing.
type failingBackend struct {
	*memlock.Backend
	err error
}

func (b failingBackend) TryAcquire(context.Context, core.AcquireRequest) (core.Lease, error) {
	return core.Lease{}, b.err
}

// Rule: a claim the backend reports as Unclaimed is not undone (no release
// round trip against a store that refused the connection); any other
// failure is.
func TestUnclaimedFailureIsNotUndone(t *testing.T) {
	refused := errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
	for _, c := range []struct {
		err      error
		releases int
	}{{core.Unclaimed(refused), 0}, {refused, 1}} {
		b := memlock.NewStore().Backend()
		l, err := core.New(failingBackend{b, c.err})
		if err != nil {
			t.Fatal(err)
		}
		_, err = l.TryAcquire(context.Background(), "k")
		if !errors.Is(err, refused) || err.Error() != `dislock: memory: acquire "k": `+refused.Error() {
			t.Fatalf("TryAcquire = %v, want the refusal, unchanged", err)
		}
		l.Close()
		if got := b.Stats().Releases; got != c.releases {
			t.Errorf("%v: %d releases, want %d", c.err, got, c.releases)
		}
	}
	if core.Unclaimed(nil) != nil {
		t.Error("Unclaimed(nil) != nil")
	}
}
