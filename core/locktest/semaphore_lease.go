package locktest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

// Rules of a held permit of a semaphore: listed by Holders, List and
// Inspect, ended by ForceRelease, confirmed by Check, renewed in one batch,
// kept by a min hold.

// testSemHolders checks rule "Holders lists every permit oldest first with
// Limit set; List shows one entry per permit, beside the mutexes, Inspect
// the oldest; ForceRelease frees every permit, each holder learns of it,
// and the key's next token is still greater".
func testSemHolders(t *testing.T, e *env) {
	const rule = "Holders lists every permit oldest first with Limit set; List shows one entry per permit, beside the mutexes, Inspect the oldest; ForceRelease frees every permit, each holder learns of it, and the key's next token is still greater"
	ps := semProcs(t, e, semLimit+1)
	base := e.key(t)
	k := base + "/sem"
	ctx := ctxT(t, 30*time.Second)
	c := ps[semLimit]
	if hs, err := c.c.Holders(ctx, k); err != nil || len(hs) != 0 {
		t.Fatalf("rule %q: Holders of a free key = %+v %v", rule, hs, err)
	}
	var held []core.Session
	for i := range semLimit {
		s := mustAcquire(t, ps[i], k, core.Limit(semLimit), core.WithOwner(fmt.Sprintf("permit-%d", i)))
		defer s.Release(context.Background())
		held = append(held, s)
	}
	hs, err := c.c.Holders(ctx, k)
	if err != nil || len(hs) != semLimit {
		t.Fatalf("rule %q: Holders = %+v %v, want %d permits", rule, hs, err, semLimit)
	}
	for i, h := range hs {
		if h.Key != k || h.Limit != semLimit || h.ExpiresAt.IsZero() || h.Remaining <= 0 {
			t.Errorf("rule %q: holder %d = %+v", rule, i, h)
		}
		if i > 0 && h.AcquiredAt.Before(hs[i-1].AcquiredAt) {
			t.Errorf("rule %q: holders not oldest first: %+v", rule, hs)
		}
		if !h.AcquiredAt.IsZero() && i > 0 && h.AcquiredAt.After(hs[i-1].AcquiredAt) && h.Owner < hs[i-1].Owner {
			t.Errorf("rule %q: holders not oldest first: %q before %q", rule, hs[i-1].Owner, h.Owner)
		}
		if !e.h.NoFencing && i > 0 && h.Token <= hs[i-1].Token { // the permits were claimed one after another
			t.Errorf("rule %q: holders not oldest first: token %d after %d", rule, h.Token, hs[i-1].Token)
		}
		j := slices.IndexFunc(held, func(s core.Session) bool { return s.Owner() == h.Owner })
		if j < 0 {
			t.Errorf("rule %q: holder %q is none of the permits", rule, h.Owner)
		} else if !e.h.NoFencing && h.Token != held[j].Token() {
			t.Errorf("rule %q: holder %q has token %d, its session %d", rule, h.Owner, h.Token, held[j].Token())
		}
	}
	m := mustAcquire(t, ps[0], base+"/mutex", core.WithOwner("mutex"))
	defer m.Release(context.Background())
	if hm, err := c.c.Holders(ctx, base+"/mutex"); err != nil || len(hm) != 1 || hm[0].Owner != "mutex" || hm[0].Limit != 0 {
		t.Errorf("rule %q: Holders of a mutex = %+v %v, want its one holder with Limit 0", rule, hm, err)
	} else if !e.h.NoFencing && hm[0].Token != m.Token() {
		t.Errorf("rule %q: Holders of a mutex has token %d, its session %d", rule, hm[0].Token, m.Token())
	}
	if e.h.NoAdmin {
		return
	}
	adm, ok := c.l.(core.Admin)
	if !ok {
		return
	}
	list, err := adm.List(ctx, base+"/")
	if err != nil || len(list) != semLimit+1 {
		t.Fatalf("rule %q: List = %+v %v, want one entry per permit and the mutex", rule, list, err)
	}
	for _, i := range list {
		if (i.Key != k || i.Limit != semLimit) && (i.Key != base+"/mutex" || i.Owner != "mutex" || i.Limit != 0) {
			t.Errorf("rule %q: List entry %+v", rule, i)
		}
	}
	info, ok, err := adm.Inspect(ctx, k)
	if err != nil || !ok || info.Owner != hs[0].Owner || info.Limit != semLimit {
		t.Errorf("rule %q: Inspect = %+v %v %v, want the oldest permit %q", rule, info, ok, err, hs[0].Owner)
	}
	released, err := adm.ForceRelease(ctx, k)
	if err != nil || !released {
		t.Fatalf("rule %q: ForceRelease = %v %v", rule, released, err)
	}
	for _, s := range held[1:] {
		checkLost(t, rule, s) // asking the store finds the loss at once
	}
	expectLost(t, rule, held[0], e.ttl+2*time.Second) // the renewer finds it at its next renewal
	if hs, err := c.c.Holders(ctx, k); err != nil || len(hs) != 0 {
		t.Fatalf("rule %q: Holders after ForceRelease = %+v %v", rule, hs, err)
	}
	if info, held, err := adm.Inspect(ctx, k); err != nil || held {
		t.Errorf("rule %q: Inspect after ForceRelease = %+v %v %v, want free", rule, info, held, err)
	}
	if released, err := adm.ForceRelease(ctx, k); err != nil || released {
		t.Errorf("rule %q: ForceRelease of the freed semaphore = %v %v, want false", rule, released, err)
	}
	s := mustAcquire(t, c, k) // free: even a mutex may take it
	defer s.Release(context.Background())
	for _, p := range held {
		if !e.h.NoFencing && s.Token() <= p.Token() {
			t.Errorf("rule %q: the mutex after ForceRelease has token %d, a permit before it had %d", rule, s.Token(), p.Token())
		}
	}
}

// testSemCheck checks rule "Check works on a permit: nil while held, and
// ErrLeaseLost once the store dropped it".
func testSemCheck(t *testing.T, e *env) {
	const rule = "Check works on a permit: nil while held, and ErrLeaseLost once the store dropped it"
	ps, k := semSetup(t, e, 2)
	s1 := mustAcquire(t, ps[0], k, core.Limit(2), core.TTL(checkTTL))
	defer s1.Release(context.Background())
	s2 := mustAcquire(t, ps[1], k, core.Limit(2), core.TTL(checkTTL))
	for _, s := range []core.Session{s1, s2} {
		d0 := s.Deadline()
		if err := s.Check(ctxT(t, 10*time.Second)); err != nil {
			t.Fatalf("rule %q: Check = %v", rule, err)
		}
		if !s.Deadline().After(d0) {
			t.Errorf("rule %q: Deadline did not move forward", rule)
		}
	}
	s2.Release(context.Background())
	if err := s1.Check(ctxT(t, 10*time.Second)); err != nil {
		t.Fatalf("rule %q: Check after another permit's release = %v", rule, err)
	}
	if drop(t, e, ps[1], k) {
		checkLost(t, rule, s1)
	}
}

// drop removes every lease of key behind its holders' backs, with p's
// ForceRelease or else the harness's Delete. It reports false, having
// done nothing, when there is neither.
func drop(t *testing.T, e *env, p *proc, key string) bool {
	t.Helper()
	switch adm, ok := p.l.(core.Admin); {
	case !e.h.NoAdmin && ok:
		if _, err := adm.ForceRelease(ctxT(t, 10*time.Second), key); err != nil {
			t.Fatal(err)
		}
	case e.h.Delete != nil:
		if err := e.h.Delete(ctxT(t, 10*time.Second), key); err != nil {
			t.Fatal(err)
		}
	default:
		return false
	}
	return true
}

// testSemRenewBatched checks rule "the renewal of many permits, of one key
// or many, and of locks besides, is one Renew call per interval; a lease of
// the batch that the store dropped is lost, the others renew".
func testSemRenewBatched(t *testing.T, e *env) {
	const rule = "the renewal of many permits, of one key or many, and of locks besides, is one Renew call per interval; a lease of the batch that the store dropped is lost, the others renew"
	p := semProcs(t, e, 1)[0]
	k := e.key(t)
	var held []core.Session
	// A TTL that outlasts a stalled commit on a busy machine: the rule
	// counts calls, and a lease lost to a slow store would leave every
	// later call short of it.
	ttl := max(e.ttl, 2*time.Second)
	take := func(key string, opts ...core.Option) {
		held = append(held, mustAcquire(t, p, key, append(opts, core.TTL(ttl))...))
	}
	const many = 16
	for range many {
		take(k+"/many", core.Limit(many))
	}
	for i := range 4 {
		for range 2 {
			take(fmt.Sprintf("%s/pair-%d", k, i), core.Limit(2))
		}
	}
	take(k + "/mutex-0")
	take(k + "/mutex-1")
	defer func() {
		for _, s := range held {
			s.Release(context.Background())
		}
	}()
	// Two calls in a row that each renew every lease: one call per
	// interval, not one per permit.
	n := len(held)
	full := func() bool {
		run := 0
		for _, c := range p.fault.renewCalls() {
			if c >= n {
				run++
				if run == 2 {
					return true
				}
			} else {
				run = 0
			}
		}
		return false
	}
	if !waitFor(t, full, 30*ttl) {
		t.Fatalf("rule %q: no two Renew calls in a row renewed all %d leases: calls of %v leases", rule, n, p.fault.renewCalls())
	}
	for i, s := range held {
		if s.Err() != nil {
			t.Fatalf("rule %q: lease %d lost: %v", rule, i, s.Err())
		}
	}
	gone := k + "/pair-0"
	if !drop(t, e, p, gone) {
		return
	}
	for _, s := range held {
		if s.Key() == gone {
			expectLost(t, rule, s, ttl+2*time.Second) // at the next renewal
		}
	}
	// That renewal renewed the others: they are held, by the store's word.
	for i, s := range held {
		if s.Key() != gone {
			if err := s.Check(ctxT(t, 10*time.Second)); err != nil {
				t.Fatalf("rule %q: lease %d, renewed in one call with the dropped ones: Check = %v", rule, i, err)
			}
		}
	}
}

// testSemMinHold checks rule "with MinHold a permit released before the
// hold ends stays held as a permit until then, longer or shorter than its
// TTL: it is listed, counts against the limit and makes a mutex claim a
// limit mismatch".
func testSemMinHold(t *testing.T, e *env) {
	const rule = "with MinHold a permit released before the hold ends stays held as a permit until then, longer or shorter than its TTL: it is listed, counts against the limit and makes a mutex claim a limit mismatch"
	ps, k := semSetup(t, e, 2)
	a, b := ps[0], ps[1]
	// A hold far past the TTL: the store keeps the released permit for it.
	const long = time.Minute
	s := mustAcquire(t, a, k+"/long", core.Limit(2), core.MinHold(long))
	if err := s.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	hs, err := b.c.Holders(ctxT(t, 10*time.Second), k+"/long")
	if err != nil || len(hs) != 1 || hs[0].Limit != 2 || (!e.h.NoFencing && hs[0].Token != s.Token()) || hs[0].Remaining < long-10*time.Second {
		t.Fatalf("rule %q: holders during a hold of %v: %+v %v, want the released permit with its hold left", rule, long, hs, err)
	}
	if _, err := b.l.TryAcquire(ctxT(t, 10*time.Second), k+"/long"); !errors.Is(err, core.ErrLimitMismatch) {
		t.Fatalf("rule %q: a mutex claim during the hold = %v, want ErrLimitMismatch", rule, err)
	}
	s2 := mustAcquire(t, b, k+"/long", core.Limit(2))
	defer s2.Release(context.Background())
	if _, err := b.l.TryAcquire(ctxT(t, 10*time.Second), k+"/long", core.Limit(2)); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("rule %q: a third permit of 2 during the hold = %v, want busy", rule, err)
	}
	// A hold shorter than the TTL: the permit frees when the hold ends.
	hold := e.ttl / 2
	start := time.Now()
	s = mustAcquire(t, a, k+"/short", core.Limit(2), core.MinHold(hold))
	if err := s.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, b, k+"/short", core.Limit(2))
	if _, err := b.l.TryAcquire(ctxT(t, 10*time.Second), k+"/short", core.Limit(2)); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("rule %q: a third permit of 2 during the hold = %v, want busy", rule, err)
	}
	s3, err := b.l.Acquire(ctxT(t, 5*e.ttl+5*time.Second), k+"/short", core.Limit(2), core.Backoff(10*time.Millisecond, e.ttl/8))
	if err != nil {
		t.Fatalf("rule %q: %v", rule, err)
	}
	defer s3.Release(context.Background())
	if d := time.Since(start); d < hold-50*time.Millisecond || d > hold+e.ttl+time.Second+e.h.ExpiryLag {
		t.Errorf("rule %q: the released permit freed %v after its claim, min hold %v", rule, d, hold)
	}
}
