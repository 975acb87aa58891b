package etcdtest_test

import (
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/etcdlock"
	"github.com/dislock/dislock/etcdlock/etcdtest"
)

// semClient returns a client on a private one-member cluster started for
// this test.
func semClient(t *testing.T) func(t testing.TB) *clientv3.Client {
	c := etcdtest.Start(t, 1)
	return func(t testing.TB) *clientv3.Client { return c.Client(t) }
}

// semBackends returns n backends on separate clients (separate processes,
// as far as etcd can tell), on one prefix.
func semBackends(t *testing.T, newClient func(testing.TB) *clientv3.Client, prefix string, n int) []*etcdlock.Backend {
	t.Helper()
	bs := make([]*etcdlock.Backend, n)
	for i := range bs {
		b, err := etcdlock.NewBackend(newClient(t), etcdlock.WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		bs[i] = b
	}
	return bs
}

func permitReq(key string, limit int, ttl time.Duration) core.AcquireRequest {
	return core.AcquireRequest{Key: key, Owner: "test", OwnerToken: rand.Text(), TTL: ttl, Limit: limit}
}

// TestSemPermits: Limit permits are granted across backends, the next claim
// is busy with the permit that expires first, tokens strictly increase,
// Holders, Inspect and List describe every permit, and a release frees one
// permit for the next claim.
func TestSemPermits(t *testing.T) {
	t.Parallel()
	newClient := semClient(t)
	prefix := uniquePrefix("sem-permits")
	bs := semBackends(t, newClient, prefix, 4)
	ctx := ctxT(t, 30*time.Second)
	const key, limit = "jobs", 3

	// A mutex use of the key first: permits' tokens come after its token.
	m, err := bs[0].TryAcquire(ctx, core.AcquireRequest{Key: key, OwnerToken: "mutex", TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := bs[0].Release(ctx, core.ReleaseRequest{Key: key, OwnerToken: "mutex"}); err != nil {
		t.Fatal(err)
	}
	last := m.Token
	ttls := []time.Duration{20 * time.Second, 5 * time.Second, 20 * time.Second}
	reqs := make([]core.AcquireRequest, limit)
	for i := range limit {
		reqs[i] = permitReq(key, limit, ttls[i])
		l, err := bs[i].TryAcquire(ctx, reqs[i])
		if err != nil {
			t.Fatalf("permit %d: %v", i, err)
		}
		if l.Token <= last {
			t.Fatalf("permit %d: token %d after %d", i, l.Token, last)
		}
		last = l.Token
	}
	_, err = bs[3].TryAcquire(ctx, permitReq(key, limit, 20*time.Second))
	var na *core.NotAcquiredError
	if !errors.As(err, &na) {
		t.Fatalf("4th permit: got %v, want busy", err)
	}
	if h := na.Holder; h == nil || h.Limit != limit || h.Remaining <= 0 || h.Remaining > 6*time.Second {
		t.Fatalf("busy holder %+v: want the 5 s permit, Limit %d", na.Holder, limit)
	}

	hs, err := bs[3].Holders(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != limit {
		t.Fatalf("Holders: %d, want %d: %+v", len(hs), limit, hs)
	}
	for i, h := range hs {
		if h.Limit != limit || h.Key != key || (i > 0 && h.Token <= hs[i-1].Token) {
			t.Fatalf("Holders[%d] = %+v: want Limit %d, oldest first", i, h, limit)
		}
	}
	in, ok, err := bs[3].Inspect(ctx, key)
	if err != nil || !ok || in.Token != hs[0].Token {
		t.Fatalf("Inspect = %+v, %v, %v: want the oldest permit %d", in, ok, err, hs[0].Token)
	}
	list, err := bs[3].List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != limit {
		t.Fatalf("List: %d entries, want %d: %+v", len(list), limit, list)
	}

	// A release frees exactly one permit.
	if err := bs[1].Release(ctx, core.ReleaseRequest{Key: key, OwnerToken: reqs[1].OwnerToken, Limit: limit}); err != nil {
		t.Fatal(err)
	}
	next := permitReq(key, limit, 20*time.Second)
	l, err := bs[3].TryAcquire(ctx, next)
	if err != nil {
		t.Fatalf("after a release: %v", err)
	}
	if l.Token <= last {
		t.Fatalf("token %d after %d", l.Token, last)
	}
	if _, err := bs[3].TryAcquire(ctx, permitReq(key, limit, time.Second)); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("full again: got %v, want busy", err)
	}

	// ForceRelease frees all permits; a mutex can then take the key, with
	// a larger token again.
	if ok, err := bs[2].ForceRelease(ctx, key); err != nil || !ok {
		t.Fatalf("ForceRelease = %v, %v", ok, err)
	}
	if hs, err := bs[2].Holders(ctx, key); err != nil || len(hs) != 0 {
		t.Fatalf("after ForceRelease: %+v, %v", hs, err)
	}
	m2, err := bs[2].TryAcquire(ctx, core.AcquireRequest{Key: key, OwnerToken: "mutex2", TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if m2.Token <= l.Token {
		t.Fatalf("mutex token %d after permit %d", m2.Token, l.Token)
	}
	hs, err = bs[2].Holders(ctx, key)
	if err != nil || len(hs) != 1 || hs[0].Limit != 0 || hs[0].Token != m2.Token {
		t.Fatalf("Holders of a mutex: %+v, %v", hs, err)
	}
}

// TestSemLimitMismatch: a claim whose limit differs from the holders'
// fails with ErrLimitMismatch and claims nothing.
func TestSemLimitMismatch(t *testing.T) {
	t.Parallel()
	newClient := semClient(t)
	bs := semBackends(t, newClient, uniquePrefix("sem-mismatch"), 2)
	ctx := ctxT(t, 30*time.Second)

	if _, err := bs[0].TryAcquire(ctx, core.AcquireRequest{Key: "m", OwnerToken: "mutex", TTL: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	_, err := bs[1].TryAcquire(ctx, permitReq("m", 2, 5*time.Second))
	if !errors.Is(err, core.ErrLimitMismatch) || errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("permit on a mutex: got %v, want ErrLimitMismatch", err)
	}

	if _, err := bs[0].TryAcquire(ctx, permitReq("s", 2, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := bs[1].TryAcquire(ctx, core.AcquireRequest{Key: "s", OwnerToken: "mutex", TTL: 5 * time.Second}); !errors.Is(err, core.ErrLimitMismatch) {
		t.Fatalf("mutex on a semaphore: got %v, want ErrLimitMismatch", err)
	}
	if _, err := bs[1].TryAcquire(ctx, permitReq("s", 3, 5*time.Second)); !errors.Is(err, core.ErrLimitMismatch) {
		t.Fatalf("limit 3 on limit 2: got %v, want ErrLimitMismatch", err)
	}
	for _, key := range []string{"m", "s"} {
		hs, err := bs[1].Holders(ctx, key)
		if err != nil || len(hs) != 1 {
			t.Fatalf("%s: holders %+v, %v: a mismatch must claim nothing", key, hs, err)
		}
	}
}

// TestSemRace: many Lockers race for the permits of one key; never more
// than Limit hold at once, in the store or as the holders believe, and
// tokens strictly increase.
func TestSemRace(t *testing.T) {
	t.Parallel()
	newClient := semClient(t)
	prefix := uniquePrefix("sem-race")
	const limit, lockers, rounds = 3, 8, 12
	ctx := ctxT(t, 60*time.Second)
	admin, err := etcdlock.NewBackend(newClient(t), etcdlock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var (
		holding, peak atomic.Int64
		mu            sync.Mutex
		tokens        = map[uint64]bool{}
		wg            sync.WaitGroup
		acquired      atomic.Int64
	)
	for range lockers {
		l, err := etcdlock.New(newClient(t), etcdlock.WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		wg.Go(func() {
			for range rounds {
				s, err := l.TryAcquire(ctx, "race", core.Limit(limit), core.TTL(5*time.Second))
				if errors.Is(err, core.ErrNotAcquired) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				n := holding.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				mu.Lock()
				if tokens[s.Token()] {
					t.Errorf("token %d handed out twice", s.Token())
				}
				tokens[s.Token()] = true
				mu.Unlock()
				acquired.Add(1)
				if hs, err := admin.Holders(ctx, "race"); err != nil {
					t.Error(err)
				} else if len(hs) > limit {
					t.Errorf("%d holders in the store: %+v", len(hs), hs)
				}
				holding.Add(-1)
				if err := s.Release(ctx); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if p := peak.Load(); p > limit {
		t.Fatalf("%d holders at once, limit %d", p, limit)
	}
	if acquired.Load() < rounds {
		t.Fatalf("only %d permits acquired in %d attempts", acquired.Load(), lockers*rounds)
	}
	t.Logf("%d permits acquired, at most %d at once", acquired.Load(), peak.Load())
}

// TestSemExpiry: a permit nobody renews frees within its TTL (etcd's lease
// TTL rounded up to whole seconds, plus its half-second expiry check).
func TestSemExpiry(t *testing.T) {
	t.Parallel()
	newClient := semClient(t)
	bs := semBackends(t, newClient, uniquePrefix("sem-expiry"), 2)
	ctx := ctxT(t, 30*time.Second)
	ttl := minTTL(t, newClient(t))
	if _, err := bs[0].TryAcquire(ctx, permitReq("e", 2, 20*time.Second)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := bs[0].TryAcquire(ctx, permitReq("e", 2, ttl)); err != nil { // never renewed
		t.Fatal(err)
	}
	for {
		_, err := bs[1].TryAcquire(ctx, permitReq("e", 2, 20*time.Second))
		if err == nil {
			break
		}
		if !errors.Is(err, core.ErrNotAcquired) {
			t.Fatal(err)
		}
		if time.Since(start) > ttl+2*time.Second {
			t.Fatalf("the permit is still held %v after its %v TTL", time.Since(start), ttl)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if took := time.Since(start); took < ttl-100*time.Millisecond {
		t.Fatalf("freed after %v, before its %v TTL", took, ttl)
	}
}

// TestSemRenewBatch: one Renew call renews mutex leases and permits of
// several semaphores in one round trip: one transaction and one keepalive
// per lease on the backend's stream.
func TestSemRenewBatch(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	cnt := &counter{}
	cfg := clientv3.Config{Endpoints: c.Endpoints(), Logger: zap.NewNop()}
	cfg.DialOptions = append(cfg.DialOptions, cnt.options()...)
	b, err := etcdlock.NewBackend(etcdtest.NewClient(t, cfg), etcdlock.WithPrefix(uniquePrefix("sem-renew")))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := ctxT(t, 30*time.Second)
	var reqs []core.RenewRequest
	for i := range 40 {
		limit := 4
		key := fmt.Sprintf("sem/%d", i/4)
		if i%10 == 9 {
			limit, key = 0, fmt.Sprintf("mutex/%d", i)
		}
		r := permitReq(key, limit, 5*time.Second)
		r.OwnerToken = fmt.Sprintf("tok-%d", i)
		if _, err := b.TryAcquire(ctx, r); err != nil {
			t.Fatalf("%d: %v", i, err)
		}
		reqs = append(reqs, core.RenewRequest{Key: r.Key, OwnerToken: r.OwnerToken, TTL: r.TTL, Limit: limit})
	}
	if _, err := b.Renew(ctx, reqs); err != nil { // opens the keepalive stream
		t.Fatal(err)
	}
	u0, s0, m0 := cnt.unary.Load(), cnt.streams.Load(), cnt.streamMsgs.Load()
	results, err := b.Renew(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range results {
		if r != nil {
			t.Fatalf("renew %d: %v", i, r)
		}
	}
	if u, s, m := cnt.unary.Load()-u0, cnt.streams.Load()-s0, cnt.streamMsgs.Load()-m0; u != 1 || s != 0 || m != int64(len(reqs)) {
		t.Fatalf("renewal of %d leases: %d transactions, %d streams opened, %d keepalives; want 1, 0, %d", len(reqs), u, s, m, len(reqs))
	}
	// A permit whose key was deleted is lost; the others renew.
	if ok, err := b.ForceRelease(ctx, "sem/0"); err != nil || !ok {
		t.Fatalf("ForceRelease = %v, %v", ok, err)
	}
	results, err = b.Renew(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range results {
		if lost := reqs[i].Key == "sem/0"; lost != errors.Is(r, core.ErrLeaseLost) {
			t.Fatalf("renew %d (%s): %v", i, reqs[i].Key, r)
		}
	}
}

// TestSemWake: a waiting Acquire of a full semaphore wakes when another
// process frees a permit, long before its backoff or the holders' expiry
// would let it poll.
func TestSemWake(t *testing.T) {
	t.Parallel()
	newClient := semClient(t)
	prefix := uniquePrefix("sem-wake")
	ctx := ctxT(t, 30*time.Second)
	holder := newLocker(t, newClient(t), prefix)
	waiter := newLocker(t, newClient(t), prefix, core.WithDefaults(core.Backoff(20*time.Second, 20*time.Second)))
	opts := []core.Option{core.Limit(2), core.TTL(20 * time.Second)}
	s1, err := holder.TryAcquire(ctx, "w", opts...)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := holder.TryAcquire(ctx, "w", opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Release(ctx)
	got := make(chan error, 1)
	var ws core.Session
	go func() {
		var err error
		ws, err = waiter.Acquire(ctx, "w", opts...)
		got <- err
	}()
	// The waiter's first attempt is busy; then free a permit.
	for {
		hs, err := holder.Holders(ctx, "w")
		if err != nil {
			t.Fatal(err)
		}
		if len(hs) == 2 {
			break
		}
	}
	time.Sleep(300 * time.Millisecond) // past the waiter's first (busy) attempt
	released := time.Now()
	if err := s1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
		if ws.Token() <= s2.Token() {
			t.Fatalf("token %d after %d", ws.Token(), s2.Token())
		}
		t.Logf("woken %v after the release", time.Since(released))
		ws.Release(ctx)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not woken by the release")
	}
}

// TestSemMinHold: a permit released before its minimum hold ends stays
// held (on a lease of the remaining hold, rounded up to whole seconds)
// until then; a lock claim meanwhile is a limit mismatch.
func TestSemMinHold(t *testing.T) {
	t.Parallel()
	newClient := semClient(t)
	prefix := uniquePrefix("sem-minhold")
	bs := semBackends(t, newClient, prefix, 1)
	a := newLocker(t, newClient(t), prefix)
	ctx := ctxT(t, 30*time.Second)
	const hold = 1500 * time.Millisecond
	s, err := a.TryAcquire(ctx, "mh", core.Limit(2), core.MinHold(hold))
	if err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	if err := s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	hs, err := bs[0].Holders(ctx, "mh")
	if err != nil || len(hs) != 1 || hs[0].Limit != 2 || hs[0].Token != s.Token() {
		t.Fatalf("holders during the min hold: %+v, %v", hs, err)
	}
	if _, err := bs[0].TryAcquire(ctx, core.AcquireRequest{Key: "mh", OwnerToken: "mutex", TTL: 5 * time.Second}); !errors.Is(err, core.ErrLimitMismatch) {
		t.Fatalf("mutex during a permit's min hold: %v", err)
	}
	if _, err := bs[0].TryAcquire(ctx, permitReq("mh", 2, 5*time.Second)); err != nil {
		t.Fatalf("second permit: %v", err)
	}
	for {
		_, err := bs[0].TryAcquire(ctx, permitReq("mh", 2, 5*time.Second))
		if err == nil {
			break
		}
		if !errors.Is(err, core.ErrNotAcquired) {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if took := time.Since(released); took < hold-100*time.Millisecond || took > hold+3*time.Second {
		t.Fatalf("the held permit freed %v after the release, min hold %v", took, hold)
	}
}
