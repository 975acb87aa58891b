package locktest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

// Rules of semaphores (core.Limit(n) with n > 1). They run when the backend
// is a core.SemaphoreBackend and are skipped otherwise, except
// SemaphoreUnsupportedWithoutBackend, which runs only then. The claims of
// permits are here, the rules of a held permit in semaphore_lease.go.

// semLimit is the number of permits of most semaphore rules.
const semLimit = 3

// noSemaphores is why a semaphore rule is skipped on a backend without
// semaphores.
const noSemaphores = "backend has no semaphores (not a core.SemaphoreBackend)"

// semProcs returns n processes, or skips the rule when the backend has no
// semaphores.
func semProcs(t *testing.T, e *env, n int, opts ...core.ClientOption) []*proc {
	t.Helper()
	return procsWith[core.SemaphoreBackend](t, e, n, noSemaphores, opts...)
}

// semSetup returns n processes (semProcs) and the subtest's key (key): the
// set-up most semaphore rules start from.
func semSetup(t *testing.T, e *env, n int) ([]*proc, string) {
	t.Helper()
	return semProcs(t, e, n), e.key(t)
}

// testSemUnsupported checks rule "a backend without semaphores answers
// Limit(n > 1) with ErrUnsupported and claims nothing".
func testSemUnsupported(t *testing.T, e *env) {
	const rule = "a backend without semaphores answers Limit(n > 1) with ErrUnsupported and claims nothing"
	a, b := e.proc(t), e.proc(t)
	_, sem := a.fault.Backend.(core.SemaphoreBackend)
	skipIf(t, sem, "backend has semaphores: the Semaphore rules check them")
	k := e.key(t)
	if _, err := a.l.TryAcquire(ctxT(t, 10*time.Second), k, core.Limit(semLimit)); !errors.Is(err, core.ErrUnsupported) {
		t.Fatalf("rule %q: TryAcquire = %v", rule, err)
	}
	if _, err := a.l.Acquire(ctxT(t, 10*time.Second), k, core.Limit(semLimit)); !errors.Is(err, core.ErrUnsupported) {
		t.Fatalf("rule %q: Acquire = %v", rule, err)
	}
	if _, err := a.c.Holders(ctxT(t, 10*time.Second), k); !errors.Is(err, core.ErrUnsupported) {
		t.Fatalf("rule %q: Holders = %v", rule, err)
	}
	s := mustAcquire(t, b, k)
	s.Release(context.Background())
}

// testSemNeverMore checks rule "a semaphore of n never has more than n
// holders, as the holders believe and as the store's Holders lists them,
// however many processes race for it with TryAcquire and Acquire".
func testSemNeverMore(t *testing.T, e *env) {
	const rule = "a semaphore of n never has more than n holders, as the holders believe and as the store's Holders lists them, however many processes race for it with TryAcquire and Acquire"
	procs := semProcs(t, e, 4)
	k := e.key(t)
	const workers, rounds = 8, 12
	var (
		mu          sync.Mutex
		holders     int
		most        int
		tokens      = map[uint64]bool{}
		acquired    int
		wg          sync.WaitGroup
		errs        = make(chan error, workers*rounds)
		limitOption = core.Limit(semLimit)
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := procs[w%len(procs)]
			for r := range rounds {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				var s core.Session
				var err error
				if (w+r)%2 == 0 {
					s, err = p.l.TryAcquire(ctx, k, limitOption)
				} else {
					s, err = p.l.Acquire(ctx, k, limitOption, core.Backoff(time.Millisecond, 20*time.Millisecond))
				}
				cancel()
				if errors.Is(err, core.ErrNotAcquired) && (w+r)%2 == 0 {
					continue // full: the TryAcquire was refused
				}
				if errors.Is(err, core.ErrLeaseLost) {
					// The reply came past the renew deadline (a store
					// stalled under this load): the engine gave the claim
					// up and undid it, so it is no holder.
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				holders++
				acquired++
				most = max(most, holders)
				n := holders
				dup := tokens[s.Token()] && !e.h.NoFencing
				tokens[s.Token()] = true
				mu.Unlock()
				if n > semLimit {
					errs <- fmt.Errorf("rule %q: %d holders of a semaphore of %d", rule, n, semLimit)
				}
				if dup {
					errs <- fmt.Errorf("rule %q: token %d handed out twice", rule, s.Token())
				}
				// Hold the permit a moment, so that holders overlap.
				time.Sleep(time.Millisecond)
				mu.Lock()
				holders--
				mu.Unlock()
				if err := s.Err(); err != nil {
					errs <- fmt.Errorf("rule %q: a permit was lost while held: %v", rule, err)
				}
				if err := s.Release(context.Background()); err != nil && !errors.Is(err, core.ErrLeaseLost) {
					// (ErrLeaseLost: the session's deadline passed while
					// the release was in flight, a slow store under this
					// load; the permit is no more held for it.)
					errs <- err
					return
				}
			}
		}()
	}
	// What the store lists, while the workers race: a sampler, so that no
	// permit is held longer for it.
	done := make(chan struct{})
	sampled := make(chan error, 1)
	go func() {
		for {
			select {
			case <-done:
				sampled <- nil
				return
			case <-time.After(5 * time.Millisecond): // a sample every round trip and 5ms
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			hs, err := procs[0].c.Holders(ctx, k)
			cancel()
			if err == nil && len(hs) > semLimit {
				err = fmt.Errorf("rule %q: the store lists %d holders of a semaphore of %d: %+v", rule, len(hs), semLimit, hs)
			}
			if err != nil {
				sampled <- err
				return
			}
		}
	}()
	wg.Wait()
	close(done)
	if err := <-sampled; err != nil {
		t.Error(err)
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if acquired == 0 {
		t.Errorf("rule %q: no acquisition at all", rule)
	}
	t.Logf("%d acquisitions, at most %d holders at once", acquired, most)
}

// testSemFull checks rule "a semaphore of n grants n permits to n
// processes at once; the next TryAcquire is busy and names the permit that
// expires first; a released permit is free at once".
func testSemFull(t *testing.T, e *env) {
	const rule = "a semaphore of n grants n permits to n processes at once; the next TryAcquire is busy and names the permit that expires first; a released permit is free at once"
	procs := semProcs(t, e, semLimit+1)
	k := e.key(t)
	// Long TTLs, so that no renewal moves an expiry while the rule runs;
	// the second permit's is half the others', so it, not the oldest,
	// expires first.
	var held []core.Session
	for i := range semLimit {
		ttl := checkTTL
		if i == 1 {
			ttl = checkTTL / 2
		}
		s, err := procs[i].l.TryAcquire(ctxT(t, 10*time.Second), k, core.Limit(semLimit), core.TTL(ttl), core.WithOwner(fmt.Sprintf("permit-%d", i)))
		if err != nil {
			t.Fatalf("rule %q: permit %d of %d: %v", rule, i+1, semLimit, err)
		}
		defer s.Release(context.Background())
		held = append(held, s)
	}
	last := procs[semLimit]
	_, err := last.l.TryAcquire(ctxT(t, 10*time.Second), k, core.Limit(semLimit))
	var na *core.NotAcquiredError
	if !errors.Is(err, core.ErrNotAcquired) || !errors.As(err, &na) {
		t.Fatalf("rule %q: TryAcquire of a full semaphore = %v, want busy", rule, err)
	}
	if !e.h.NoHolderInfo {
		h := na.Holder
		switch {
		case h == nil:
			t.Errorf("rule %q: the busy answer names no holder", rule)
		case h.Key != k || h.Owner != "permit-1":
			t.Errorf("rule %q: busy answer names %q of %q, want permit-1 (it expires first)", rule, h.Owner, h.Key)
		case h.Limit != semLimit:
			t.Errorf("rule %q: busy answer has Limit %d, want %d", rule, h.Limit, semLimit)
		case h.Remaining <= 0 || h.Remaining > checkTTL/2:
			t.Errorf("rule %q: busy answer's Remaining %v outside (0, %v]", rule, h.Remaining, checkTTL/2)
		case !e.h.NoFencing && h.Token != held[1].Token():
			t.Errorf("rule %q: busy answer's token %d, permit-1 has %d", rule, h.Token, held[1].Token())
		}
	}
	if err := held[1].Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	s, err := last.l.TryAcquire(ctxT(t, 10*time.Second), k, core.Limit(semLimit))
	if err != nil {
		t.Fatalf("rule %q: TryAcquire after a permit was released = %v", rule, err)
	}
	defer s.Release(context.Background())
	if _, err := procs[1].l.TryAcquire(ctxT(t, 10*time.Second), k, core.Limit(semLimit)); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("rule %q: TryAcquire of the again full semaphore = %v, want busy", rule, err)
	}
}

// testSemTriesAllGranted checks rule "TryAcquires from several processes
// racing for a free semaphore of n are granted n permits, no more and no
// fewer: none is answered busy while a permit is free".
func testSemTriesAllGranted(t *testing.T, e *env) {
	const rule = "TryAcquires from several processes racing for a free semaphore of n are granted n permits, no more and no fewer: none is answered busy while a permit is free"
	ps := semProcs(t, e, 3)
	const limit, rounds = 6, 3
	const tries = limit + 2
	ctx := ctxT(t, 60*time.Second)
	for r := range rounds {
		k := fmt.Sprintf("%s/%d", e.key(t), r)
		start := make(chan struct{})
		type result struct {
			s   core.Session
			err error
		}
		results := make(chan result, tries)
		for i := range tries {
			p := ps[i%len(ps)]
			go func() {
				<-start
				s, err := p.l.TryAcquire(ctx, k, core.Limit(limit), core.TTL(checkTTL))
				results <- result{s, err}
			}()
		}
		close(start)
		granted, busy := 0, 0
		for range tries {
			res := <-results
			switch {
			case res.err == nil:
				granted++
				defer res.s.Release(context.Background())
			case errors.Is(res.err, core.ErrNotAcquired):
				busy++
			default:
				t.Errorf("rule %q: round %d: TryAcquire = %v", rule, r, res.err)
			}
		}
		if granted != limit || busy != tries-limit {
			t.Errorf("rule %q: round %d: %d of %d racing tries granted, %d busy; want %d granted", rule, r, granted, tries, busy, limit)
		}
		if hs, err := ps[0].c.Holders(ctx, k); err != nil || len(hs) != granted {
			t.Errorf("rule %q: round %d: the store lists %d holders (%v), %d were granted", rule, r, len(hs), err, granted)
		}
	}
}

// testSemTokens checks rule "fencing tokens strictly increase per key across
// every permit of a semaphore and across mutex use of the key".
func testSemTokens(t *testing.T, e *env) {
	const rule = "fencing tokens strictly increase per key across every permit of a semaphore and across mutex use of the key"
	skipIf(t, e.h.NoFencing, "backend has no fencing tokens (NoFencing)")
	ps, k := semSetup(t, e, 2)
	a, b := ps[0], ps[1]
	var last uint64
	check := func(what string, s core.Session) {
		t.Helper()
		if s.Token() <= last {
			t.Fatalf("rule %q: %s: token %d after %d", rule, what, s.Token(), last)
		}
		last = s.Token()
	}
	m := mustAcquire(t, a, k)
	check("mutex", m)
	m.Release(context.Background())
	p1 := mustAcquire(t, a, k, core.Limit(2))
	check("first permit", p1)
	p2 := mustAcquire(t, b, k, core.Limit(2))
	check("second permit", p2)
	p2.Release(context.Background())
	p3 := mustAcquire(t, b, k, core.Limit(2))
	check("permit after a release", p3)
	p1.Release(context.Background())
	p3.Release(context.Background())
	m = mustAcquire(t, b, k)
	check("mutex after the semaphore", m)
	m.Release(context.Background())

	// Across an expiry: SemaphoreCrashedPermitFreesWithinTTL.
}

// testSemCrash checks rule "a permit whose holder stops renewing frees
// within its TTL, not before, and a waiter gets it, with a greater token;
// the other permits stay held".
func testSemCrash(t *testing.T, e *env) {
	const rule = "a permit whose holder stops renewing frees within its TTL, not before, and a waiter gets it, with a greater token; the other permits stay held"
	ps, k := semSetup(t, e, 4)
	a, b, c := ps[0], ps[1], ps[2]
	claimed := time.Now() // the store keeps the permit at least a TTL from this
	sa := mustAcquire(t, a, k, core.Limit(2), core.WithOwner("crashes"))
	sb := mustAcquire(t, b, k, core.Limit(2), core.WithOwner("stays"))
	defer sb.Release(context.Background())
	got := make(chan waitResult, 1)
	n := c.fault.busies.Load()
	go func() {
		s, err := c.l.Acquire(ctxT(t, 10*e.ttl+10*time.Second), k, core.Limit(2), core.WithOwner("waiter"), core.Backoff(10*time.Millisecond, e.ttl/4))
		got <- waitResult{s, err, time.Now()}
	}()
	if !waitFor(t, func() bool { return c.fault.busies.Load() > n }, 10*time.Second) {
		t.Fatalf("rule %q: the waiter was never answered busy", rule)
	}
	start := time.Now()
	a.fault.down.Store(true) // a "crashes": no renewal reaches the store
	r := acquired(t, rule, got, 10*e.ttl+10*time.Second, "the waiter never got the permit")
	sc := r.s
	defer sc.Release(context.Background())
	if d := r.at.Sub(start); d > e.ttl+time.Second+e.h.ExpiryLag {
		t.Errorf("rule %q: took %v (TTL %v)", rule, d, e.ttl)
	}
	// The last write of the permit reached the store no earlier than its
	// claim or its last renewal was sent; allow 5ms for the store's expiry
	// resolution.
	if last := time.Unix(0, a.fault.lastRenew.Load()); last.After(claimed) {
		claimed = last
	}
	if d := r.at.Sub(claimed); d < e.ttl-5*time.Millisecond {
		t.Errorf("rule %q: the waiter got the permit %v after its holder's last renewal was sent, before the TTL %v", rule, d, e.ttl)
	}
	if !e.h.NoFencing && (sc.Token() <= sa.Token() || sc.Token() <= sb.Token()) {
		t.Errorf("rule %q: token %d after the permits %d and %d", rule, sc.Token(), sa.Token(), sb.Token())
	}
	if sb.Err() != nil {
		t.Fatalf("rule %q: the other permit was lost: %v", rule, sb.Err())
	}
	hs, err := b.c.Holders(ctxT(t, 10*time.Second), k)
	if err != nil {
		t.Fatal(err)
	}
	var owners []string
	for _, h := range hs {
		owners = append(owners, h.Owner)
	}
	slices.Sort(owners)
	if !slices.Equal(owners, []string{"stays", "waiter"}) {
		t.Errorf("rule %q: holders %q, want [stays waiter]", rule, owners)
	}
	if _, err := ps[3].l.TryAcquire(ctxT(t, 10*time.Second), k, core.Limit(2)); !errors.Is(err, core.ErrNotAcquired) {
		t.Errorf("rule %q: a third permit: %v, want busy", rule, err)
	}
}

// testSemNotified checks rule "with release notifications a waiter on a
// full semaphore wakes on a permit's release, and on a ForceRelease of the
// key, not on its poll timer".
func testSemNotified(t *testing.T, e *env) {
	const rule = "with release notifications a waiter on a full semaphore wakes on a permit's release, and on a ForceRelease of the key, not on its poll timer"
	skipIf(t, e.h.NoWatch, "backend has no release notifications (NoWatch)")
	log := &acquireLog{}
	ps := semProcs(t, e, 2)
	a1, a2 := ps[0], ps[1]
	b := e.proc(t, core.WithObserver(log))
	k := e.key(t)
	subscribe(t, rule, a1, b, k+"-warm")
	s1 := mustAcquire(t, a1, k, core.Limit(2), core.TTL(checkTTL))
	defer s1.Release(context.Background())
	s2 := mustAcquire(t, a2, k, core.Limit(2), core.TTL(checkTTL))
	acquire := func(ctx context.Context) (core.Session, error) {
		return b.l.Acquire(ctx, k, core.Limit(2), core.Backoff(20*time.Second, 20*time.Second))
	}
	waitNotified(t, rule, b, log, func() { s2.Release(context.Background()) }, acquire)
	adm, ok := a2.l.(core.Admin)
	if e.h.NoAdmin || !ok {
		return
	}
	mustAcquire(t, a2, k, core.Limit(2), core.TTL(checkTTL)) // full again
	waitNotified(t, rule, b, log, func() {
		if _, err := adm.ForceRelease(ctxT(t, 10*time.Second), k); err != nil {
			t.Fatalf("rule %q: ForceRelease = %v", rule, err)
		}
	}, acquire)
}

// testSemMismatch checks rule "a claim with another limit than the key's
// holders (a mutex counts as 1) fails with ErrLimitMismatch naming both
// limits, both ways, from the holder's own process too, and claims
// nothing".
func testSemMismatch(t *testing.T, e *env) {
	const rule = "a claim with another limit than the key's holders (a mutex counts as 1) fails with ErrLimitMismatch naming both limits, both ways, from the holder's own process too, and claims nothing"
	ps, k := semSetup(t, e, 2)
	a, b := ps[0], ps[1]
	mismatch := func(what string, key string, have, want int) {
		t.Helper()
		opts := []core.Option{core.Limit(want)}
		// What core.LimitMismatch says, after its sentinel's prefix.
		says := core.LimitMismatch(key, have, want).Error()
		says = says[strings.Index(says, "key "):]
		for _, p := range []*proc{b, a} { // a holds the key: its backend asks the store too
			s, err := p.l.TryAcquire(ctxT(t, 10*time.Second), key, opts...)
			if err == nil {
				s.Release(context.Background())
			}
			if !errors.Is(err, core.ErrLimitMismatch) || errors.Is(err, core.ErrNotAcquired) {
				t.Fatalf("rule %q: %s: TryAcquire = %v, want ErrLimitMismatch (not busy)", rule, what, err)
			}
			if !strings.Contains(err.Error(), says) {
				t.Errorf("rule %q: %s: the error %q does not say %q", rule, what, err, says)
			}
		}
		// A wait ends with the mismatch in its error, whether it ends at
		// once or when ctx does. ctx leaves the first attempt time for its
		// answer on a busy machine (100ms did not always on etcd).
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s, err := b.l.Acquire(ctx, key, opts...)
		if err == nil {
			s.Release(context.Background())
		}
		if !errors.Is(err, core.ErrLimitMismatch) {
			t.Fatalf("rule %q: %s: Acquire = %v, want an error matching ErrLimitMismatch", rule, what, err)
		}
	}

	// A mutex holder; a semaphore claim.
	m := mustAcquire(t, a, k+"/mutex")
	mismatch("semaphore of 3 on a mutex", k+"/mutex", 1, 3)
	if hs, err := a.c.Holders(ctxT(t, 10*time.Second), k+"/mutex"); err != nil || len(hs) != 1 || hs[0].Limit != 0 {
		t.Fatalf("rule %q: holders of the mutex after the mismatch: %+v %v", rule, hs, err)
	}
	m.Release(context.Background())
	s := mustAcquire(t, b, k+"/mutex", core.Limit(3)) // free now: any limit
	s.Release(context.Background())

	// A semaphore of 3; a mutex claim and a claim of 4.
	p := mustAcquire(t, a, k+"/sem", core.Limit(3))
	defer p.Release(context.Background())
	mismatch("mutex on a semaphore of 3", k+"/sem", 3, 1)
	mismatch("semaphore of 4 on a semaphore of 3", k+"/sem", 3, 4)
	hs, err := a.c.Holders(ctxT(t, 10*time.Second), k+"/sem")
	if err != nil || len(hs) != 1 || hs[0].Limit != 3 {
		t.Fatalf("rule %q: holders of the semaphore after the mismatches: %+v %v", rule, hs, err)
	}
	s = mustAcquire(t, b, k+"/sem", core.Limit(3)) // the right limit still gets a permit
	s.Release(context.Background())
}

// testSemReconcile checks rule "a semaphore claim whose reply is lost is
// undone as a permit: nothing stays held until the TTL".
func testSemReconcile(t *testing.T, e *env) {
	const rule = "a semaphore claim whose reply is lost is undone as a permit: nothing stays held until the TTL"
	ps, k := semSetup(t, e, 3)
	a, b, c := ps[0], ps[1], ps[2]
	a.fault.loseReply.Store(true)
	_, err := a.l.TryAcquire(ctxT(t, 10*time.Second), k, core.Limit(2), core.TTL(60*time.Second))
	a.fault.loseReply.Store(false)
	if err == nil || errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("rule %q: want a backend error, got %v", rule, err)
	}
	// Both permits are free: the orphan would hold one for 60s.
	s1 := mustAcquire(t, b, k, core.Limit(2))
	defer s1.Release(context.Background())
	s2 := mustAcquire(t, c, k, core.Limit(2))
	s2.Release(context.Background())
}
