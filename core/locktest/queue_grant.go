package locktest

import (
	"crypto/rand"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

// Rules of the queue's grant rule (core.Queuer), checked with raw Backend
// calls: who may take a free key or permit while waiters are queued. The
// set-ups (rawQueue, semQueue) are in queue.go.

// testQueueNoBarging checks rule "on a Queuer a caller that did not wait
// never overtakes a queued waiter, nor after a ForceRelease or the expiry
// of the holder's lease; a release or a ForceRelease tells the first
// waiter, a grant takes it out of line; a Leave while the key is held and a
// release with nobody queued send no turn; a free key with waiters is not
// held", with raw Backend calls.
func testQueueNoBarging(t *testing.T, e *env) {
	const rule = "on a Queuer a caller that did not wait never overtakes a queued waiter, nor after a ForceRelease or the expiry of the holder's lease; a release or a ForceRelease tells the first waiter, a grant takes it out of line; a Leave while the key is held and a release with nobody queued send no turn; a free key with waiters is not held"
	holder, waiter, other := rawQueuer(t, e), rawQueuer(t, e), rawQueuer(t, e)
	q := newRawQueue(t, e, rule, 0)
	k, ctx := q.key, q.ctx
	// Turns are read where the waiters queued: a store need tell no other
	// process (core.Queuer).
	turns := watchTurns(t, rule, waiter, k)

	h := q.req("")
	l0 := q.grant(holder, h, "the first claim")
	w0, w1, w2 := "w0-"+rand.Text(), "w1-"+rand.Text(), "w2-"+rand.Text()
	q.busy(other, q.req(w0), "a waiter on a held key")
	q.busy(waiter, q.req(w1), "a second waiter on a held key")
	// A turn sent for this Leave would name w1 and come before the
	// release's: the turns that follow would each be one behind.
	if err := other.Leave(ctx, k, w0); err != nil {
		t.Errorf("rule %q: Leave = %v", rule, err)
	}
	q.release(holder, h)
	turns.expect(t, rule, "release with a waiter queued", w1)
	adm, isAdmin := other.(core.Admin)
	isAdmin = isAdmin && !e.h.NoAdmin
	if isAdmin {
		if info, held, err := adm.Inspect(ctx, k); err != nil || held {
			t.Errorf("rule %q: Inspect of a free key with a waiter = %+v %v %v, want free", rule, info, held, err)
		}
		list, err := adm.List(ctx, k)
		if err != nil || slices.ContainsFunc(list, func(i core.Info) bool { return i.Key == k }) {
			t.Errorf("rule %q: List of a free key with a waiter = %+v %v, want it absent", rule, list, err)
		}
	}
	q.busy(other, q.req(""), "a TryAcquire without Waiter while a waiter is queued on the free key")
	q.busy(waiter, q.req(w2), "a second waiter while the first is queued on the free key")
	g1 := q.req(w1)
	l1 := q.grant(waiter, g1, "the first waiter on the free key")
	if !e.h.NoFencing && l1.Token <= l0.Token {
		t.Errorf("rule %q: token %d after %d", rule, l1.Token, l0.Token)
	}
	q.release(waiter, g1)
	turns.expect(t, rule, "release with the second waiter queued", w2)
	q.busy(holder, q.req(""), "a TryAcquire without Waiter while the second waiter is queued")
	g2 := q.req(w2)
	q.grant(waiter, g2, "the second waiter")
	q.release(waiter, g2) // nobody queued: no turn
	// Both grants took their waiter out of line: the key is anyone's.
	h = q.req("")
	q.grant(holder, h, "a TryAcquire once every waiter got its turn")
	q.release(holder, h) // nobody queued: no turn
	if err := holder.Leave(ctx, k, "nobody-"+rand.Text()); err != nil {
		t.Errorf("rule %q: Leave of a waiter not in line = %v, want nil", rule, err)
	}
	// freshTurn queues a new waiter on a held key and releases it: the
	// turn expected names that waiter, so a turn sent since the last one
	// expected, which would come first, is caught.
	freshTurn := func(what string) string {
		t.Helper()
		h := q.req("")
		q.grant(holder, h, "a claim")
		w := "w-" + rand.Text()
		q.busy(waiter, q.req(w), "a waiter")
		q.release(holder, h)
		turns.expect(t, rule, what, w)
		return w
	}
	w3 := freshTurn("the first turn after a release with nobody queued")
	// The queue outlives its holder: a ForceRelease tells the first waiter.
	g3 := q.req(w3)
	q.grant(waiter, g3, "the waiter told its turn")
	w4 := "w4-" + rand.Text()
	q.busy(waiter, q.req(w4), "a second waiter of the holder's process")
	if isAdmin {
		if released, err := adm.ForceRelease(ctx, k); err != nil || !released {
			t.Fatalf("rule %q: ForceRelease = %v %v", rule, released, err)
		}
		turns.expect(t, rule, "ForceRelease with a waiter queued", w4)
		q.busy(holder, q.req(""), "a TryAcquire without Waiter after a ForceRelease, a waiter queued")
	} else {
		q.release(waiter, g3)
		turns.expect(t, rule, "release with a waiter queued", w4)
	}
	g4 := q.req(w4)
	q.grant(waiter, g4, "the waiter told by the ForceRelease")
	q.release(waiter, g4)
	// A lease that expires keeps the queue too: the waiter, trying again,
	// gets the key, and a caller that did not wait is busy until it does.
	// The store need not tell the waiter when the lease runs out, but may
	// (a ZooKeeper waiter's backend times the holder's lease).
	short := q.req("")
	short.TTL = 300 * time.Millisecond
	q.grant(holder, short, "a short lease")
	w5 := "w5-" + rand.Text()
	turns.skip = map[string]bool{w5: true}
	g5 := q.req(w5)
	q.busy(waiter, g5, "a waiter on a short lease")
	granted := waitFor(t, func() bool {
		q.busy(holder, q.req(""), "a TryAcquire without Waiter, a waiter queued, before and after the lease expired")
		_, err := waiter.TryAcquire(ctx, g5)
		if err != nil && !errors.Is(err, core.ErrNotAcquired) {
			t.Fatalf("rule %q: the waiter's try = %v", rule, err)
		}
		return err == nil
	}, 10*time.Second)
	if !granted {
		t.Fatalf("rule %q: the waiter did not get the key within 10s of the holder's lease of %v", rule, short.TTL)
	}
	q.release(waiter, g5)
	w6 := freshTurn("the first turn after an expiry and a release with nobody queued")
	if err := waiter.Leave(ctx, k, w6); err != nil {
		t.Errorf("rule %q: Leave = %v", rule, err)
	}
}

// testQueueSemaphore checks rule "on a Queuer semaphore a queued waiter is
// not overtaken for a freed permit by a caller that did not wait".
func testQueueSemaphore(t *testing.T, e *env) {
	const rule = "on a Queuer semaphore a queued waiter is not overtaken for a freed permit by a caller that did not wait"
	holder, waiter, other := rawQueuer(t, e), rawQueuer(t, e), rawQueuer(t, e)
	_, sem := holder.(core.SemaphoreBackend)
	skipIf(t, !sem, noSemaphores)
	q := newRawQueue(t, e, rule, 2)
	q.grant(holder, q.req(""), "a permit")
	q.grant(holder, q.req(""), "a permit")
	w := "w-" + rand.Text()
	q.busy(waiter, q.req(w), "a waiter on a full semaphore")
	q.release(holder, q.held[0])
	q.busy(other, q.req(""), "a TryAcquire without Waiter, the permit freed for a waiter")
	g := q.req(w)
	q.grant(waiter, g, "the waiter's claim of the freed permit")
	q.release(waiter, g)
}

// testQueueSemaphoreGrant checks rule "on a Queuer semaphore a waiter is
// granted a permit when fewer live waiters are queued before it than
// permits are free, and answered busy otherwise".
func testQueueSemaphoreGrant(t *testing.T, e *env) {
	const rule = "on a Queuer semaphore a waiter is granted a permit when fewer live waiters are queued before it than permits are free, and answered busy otherwise"
	q, w := newSemQueue(t, e, rule, 3)
	q.releaseHeld(0)
	q.releaseHeld(1) // two permits free, three waiters
	q.busy(q.wait, q.req(w[2]), "the third waiter, two waiters before it and two permits free")
	l2 := q.grant(q.wait, q.req(w[1]), "the second waiter, one waiter before it and two permits free")
	// w[1] is out of line: one permit free, w[0] first, w[2] behind it.
	q.busy(q.wait, q.req(w[2]), "the third waiter, one waiter before it and one permit free")
	q.busy(q.holder, q.req(""), "a claim without a Waiter while live waiters hold every free permit's turn")
	l1 := q.grant(q.wait, q.req(w[0]), "the first waiter, nobody before it and one permit free")
	// Tokens increase in the order of the grants, not of the line
	// (core.SemaphoreBackend).
	if !e.h.NoFencing && l1.Token <= l2.Token {
		t.Errorf("rule %q: the first waiter, granted after the second, got token %d after %d", rule, l1.Token, l2.Token)
	}
	q.busy(q.wait, q.req(w[2]), "the last waiter on a full semaphore")
	if err := q.wait.Leave(q.ctx, q.key, w[2]); err != nil {
		t.Errorf("rule %q: Leave = %v", rule, err)
	}
}
