package zklock_test

import (
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/zklock"
)

func permitReq(key string, limit int, ttl time.Duration) core.AcquireRequest {
	return core.AcquireRequest{Key: key, Owner: "test", OwnerToken: rand.Text(), TTL: ttl, Limit: limit}
}

// semBackends returns n backends, each on a session of its own (separate
// processes, as far as ZooKeeper can tell), on one root.
func semBackends(t *testing.T, n int) []*zklock.Backend {
	t.Helper()
	connect, root := singleConnect(t), testRoot()
	bs := make([]*zklock.Backend, n)
	for i := range bs {
		bs[i] = newBackend(t, connect, root, zklock.WithSessionTimeout(30*time.Second))
	}
	return bs
}

// TestSemPermits: Limit permits are granted across sessions (and twice
// through one backend), the next claim is busy with the permit that
// expires first, tokens strictly increase across mutex use and permits,
// Holders, Inspect and List describe every permit, a release frees one
// permit, and ForceRelease frees them all.
func TestSemPermits(t *testing.T) {
	bs := semBackends(t, 3)
	ctx := ctxT(t, 60*time.Second)
	const key, limit = "jobs", 3

	m, err := bs[0].TryAcquire(ctx, core.AcquireRequest{Key: key, OwnerToken: "mutex", TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := bs[0].Release(ctx, core.ReleaseRequest{Key: key, OwnerToken: "mutex"}); err != nil {
		t.Fatal(err)
	}
	last := m.Token
	ttls := []time.Duration{15 * time.Second, 5 * time.Second, 15 * time.Second}
	owners := []*zklock.Backend{bs[0], bs[1], bs[1]} // two permits through one backend
	reqs := make([]core.AcquireRequest, limit)
	for i := range limit {
		reqs[i] = permitReq(key, limit, ttls[i])
		l, err := owners[i].TryAcquire(ctx, reqs[i])
		if err != nil {
			t.Fatalf("permit %d: %v", i, err)
		}
		if l.Token <= last {
			t.Fatalf("permit %d: token %d after %d", i, l.Token, last)
		}
		last = l.Token
	}
	_, err = bs[2].TryAcquire(ctx, permitReq(key, limit, 15*time.Second))
	var na *core.NotAcquiredError
	if !errors.As(err, &na) {
		t.Fatalf("4th permit: got %v, want busy", err)
	}
	if h := na.Holder; h == nil || h.Limit != limit || h.Remaining <= 0 || h.Remaining > 6*time.Second {
		t.Fatalf("busy holder %+v: want the 5 s permit, Limit %d", na.Holder, limit)
	}

	hs, err := bs[2].Holders(ctx, key)
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
	in, ok, err := bs[2].Inspect(ctx, key)
	if err != nil || !ok || in.Token != hs[0].Token {
		t.Fatalf("Inspect = %+v, %v, %v: want the oldest permit %d", in, ok, err, hs[0].Token)
	}
	list, err := bs[2].List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != limit {
		t.Fatalf("List: %d entries, want %d: %+v", len(list), limit, list)
	}

	if err := bs[1].Release(ctx, core.ReleaseRequest{Key: key, OwnerToken: reqs[1].OwnerToken, Limit: limit}); err != nil {
		t.Fatal(err)
	}
	l, err := bs[2].TryAcquire(ctx, permitReq(key, limit, 15*time.Second))
	if err != nil {
		t.Fatalf("after a release: %v", err)
	}
	if l.Token <= last {
		t.Fatalf("token %d after %d", l.Token, last)
	}
	if _, err := bs[2].TryAcquire(ctx, permitReq(key, limit, time.Second)); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("full again: got %v, want busy", err)
	}

	if ok, err := bs[2].ForceRelease(ctx, key); err != nil || !ok {
		t.Fatalf("ForceRelease = %v, %v", ok, err)
	}
	if hs, err := bs[2].Holders(ctx, key); err != nil || len(hs) != 0 {
		t.Fatalf("after ForceRelease: %+v, %v", hs, err)
	}
	// The holders learn of it at their next renewal.
	res, err := bs[0].Renew(ctx, []core.RenewRequest{{Key: key, OwnerToken: reqs[0].OwnerToken, TTL: 15 * time.Second, Limit: limit}})
	if err != nil || !errors.Is(res[0], core.ErrLeaseLost) {
		t.Fatalf("renewal after ForceRelease: %v, %v", res, err)
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
	bs := semBackends(t, 2)
	ctx := ctxT(t, 60*time.Second)
	if _, err := bs[0].TryAcquire(ctx, core.AcquireRequest{Key: "m", OwnerToken: "mutex", TTL: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	for _, b := range bs { // the holder's own backend asks the store too
		_, err := b.TryAcquire(ctx, permitReq("m", 2, 5*time.Second))
		if !errors.Is(err, core.ErrLimitMismatch) || errors.Is(err, core.ErrNotAcquired) {
			t.Fatalf("permit on a mutex: got %v, want ErrLimitMismatch", err)
		}
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
		names, _, err := rawConn(t, singleConnect(t)).Children(bs[1].KeyPath(key))
		if err != nil || len(names) != 1 {
			t.Fatalf("%s: children %v, %v: a mismatch must leave no claim", key, names, err)
		}
	}
}

// TestSemRace: Lockers on separate sessions race for the permits of one
// key; never more than Limit hold at once, in the store or as the holders
// believe, and tokens are never handed out twice.
func TestSemRace(t *testing.T) {
	const limit, lockers, rounds = 3, 6, 12
	bs := semBackends(t, lockers+1)
	ctx := ctxT(t, 120*time.Second)
	admin := bs[lockers]
	var (
		holding, peak atomic.Int64
		mu            sync.Mutex
		tokens        = map[uint64]bool{}
		wg            sync.WaitGroup
		acquired      atomic.Int64
	)
	for i := range lockers {
		l := newLocker(t, bs[i], core.TTL(5*time.Second))
		wg.Go(func() {
			for range rounds {
				s, err := l.TryAcquire(ctx, "race", core.Limit(limit))
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

// TestSemExpiry: a permit nobody renews frees within its TTL, though its
// session lives on: the next claim finds it run out and deletes it.
func TestSemExpiry(t *testing.T) {
	bs := semBackends(t, 2)
	ctx := ctxT(t, 60*time.Second)
	const ttl = time.Second
	if _, err := bs[0].TryAcquire(ctx, permitReq("e", 2, 15*time.Second)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := bs[0].TryAcquire(ctx, permitReq("e", 2, ttl)); err != nil { // never renewed
		t.Fatal(err)
	}
	for {
		_, err := bs[1].TryAcquire(ctx, permitReq("e", 2, 15*time.Second))
		if err == nil {
			break
		}
		if !errors.Is(err, core.ErrNotAcquired) {
			t.Fatal(err)
		}
		if time.Since(start) > ttl+time.Second {
			t.Fatalf("the permit is still held %v after its %v TTL", time.Since(start), ttl)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if took := time.Since(start); took < ttl-100*time.Millisecond {
		t.Fatalf("freed after %v, before its %v TTL", took, ttl)
	}
}

// TestSemRenewBatch: one Renew call renews mutex leases and permits of
// several semaphores in one multi.
func TestSemRenewBatch(t *testing.T) {
	connect := singleConnect(t)
	var cnt counter
	b := newBackend(t, connect, testRoot(), zklock.WithSessionTimeout(30*time.Second), zklock.WithDialer(cnt.dial))
	ctx := ctxT(t, 60*time.Second)
	var reqs []core.RenewRequest
	for i := range 40 {
		limit := 4
		key := fmt.Sprintf("sem/%d", i/4)
		if i%10 == 9 {
			limit, key = 0, fmt.Sprintf("mutex/%d", i)
		}
		r := permitReq(key, limit, 5*time.Second)
		if _, err := b.TryAcquire(ctx, r); err != nil {
			t.Fatalf("%d: %v", i, err)
		}
		reqs = append(reqs, core.RenewRequest{Key: r.Key, OwnerToken: r.OwnerToken, TTL: r.TTL, Limit: limit})
	}
	n0 := cnt.n.Load()
	results, err := b.Renew(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range results {
		if r != nil {
			t.Fatalf("renew %d: %v", i, r)
		}
	}
	if n := cnt.n.Load() - n0; n != 1 {
		t.Fatalf("renewal of %d leases: %d requests, want 1", len(reqs), n)
	}
}

// TestSemWake: a waiting Acquire of a full semaphore wakes when another
// process frees a permit, long before its backoff would let it poll.
func TestSemWake(t *testing.T) {
	bs := semBackends(t, 2)
	ctx := ctxT(t, 60*time.Second)
	holder := newLocker(t, bs[0], core.TTL(15*time.Second))
	waiter := newLocker(t, bs[1], core.TTL(15*time.Second), core.Backoff(20*time.Second, 20*time.Second))
	s1, err := holder.TryAcquire(ctx, "w", core.Limit(2))
	if err != nil {
		t.Fatal(err)
	}
	s2, err := holder.TryAcquire(ctx, "w", core.Limit(2))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Release(ctx)
	got := make(chan error, 1)
	var ws core.Session
	go func() {
		var err error
		ws, err = waiter.Acquire(ctx, "w", core.Limit(2))
		got <- err
	}()
	time.Sleep(500 * time.Millisecond) // past the waiter's first (busy) attempt
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
// counted (as a permit hold) until then; a lock claim meanwhile is a limit
// mismatch.
func TestSemMinHold(t *testing.T) {
	bs := semBackends(t, 2)
	ctx := ctxT(t, 60*time.Second)
	a := newLocker(t, bs[0], core.TTL(5*time.Second))
	const hold = 1500 * time.Millisecond
	s, err := a.TryAcquire(ctx, "mh", core.Limit(2), core.MinHold(hold))
	if err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	if err := s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	hs, err := bs[1].Holders(ctx, "mh")
	if err != nil || len(hs) != 1 || hs[0].Limit != 2 || hs[0].Token != s.Token() {
		t.Fatalf("holders during the min hold: %+v, %v", hs, err)
	}
	if _, err := bs[1].TryAcquire(ctx, core.AcquireRequest{Key: "mh", OwnerToken: "mutex", TTL: 5 * time.Second}); !errors.Is(err, core.ErrLimitMismatch) {
		t.Fatalf("mutex during a permit's min hold: %v", err)
	}
	if _, err := bs[1].TryAcquire(ctx, permitReq("mh", 2, 5*time.Second)); err != nil {
		t.Fatalf("second permit: %v", err)
	}
	if _, err := bs[1].TryAcquire(ctx, permitReq("mh", 2, 5*time.Second)); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("third permit of 2 during the min hold: %v", err)
	}
	for {
		_, err := bs[1].TryAcquire(ctx, permitReq("mh", 2, 5*time.Second))
		if err == nil {
			break
		}
		if !errors.Is(err, core.ErrNotAcquired) {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if took := time.Since(released); took < hold-100*time.Millisecond || took > hold+2*time.Second {
		t.Fatalf("the held permit freed %v after the release, min hold %v", took, hold)
	}
}
