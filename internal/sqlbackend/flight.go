package sqlbackend

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dislock/dislock/core"
)

// Claims lets the plain tries of one key in one Backend share the outcome
// of a claim that is already on its way to the store. A hot key that comes
// free (its holder here released it) draws every goroutine trying it into
// the same write at once: one wins, and the others wait for its row lock
// and its commit flush, each holding a pool connection, and then find the
// key held. With Claims, while one try's claim of a key is in flight, a
// later try of that key waits for it without a connection:
//
//   - when that claim won, the later try answers busy with the winner's
//     lease. The key was held from the claim's commit, which the winner's
//     release cannot precede, so it was held at some instant of the later
//     try's call;
//   - any other outcome (busy, refused, a failure) sends the later try to
//     the store itself, so no failure and no stale answer is passed on as
//     busy.
//
// Its zero value is ready.
type Claims struct {
	mu sync.Mutex
	m  map[string]*Claim
}

// Claim is one claim of a key on its way to the store.
type Claim struct {
	done    chan struct{}
	won     *core.Info   // set before done is closed when the claim won
	waiting atomic.Int32 // tries in Wait
}

// Begin returns the claim of key already on its way (lead false: Wait for
// it), or starts one that the caller leads (lead true: End it when its
// answer is in).
func (c *Claims) Begin(key string) (cl *Claim, lead bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl := c.m[key]; cl != nil {
		return cl, false
	}
	if c.m == nil {
		c.m = make(map[string]*Claim)
	}
	cl = &Claim{done: make(chan struct{})}
	c.m[key] = cl
	return cl, true
}

// End records the answer of the claim cl of key that the caller led (won:
// it won lease, for owner), and wakes the tries waiting for it.
func (c *Claims) End(key string, cl *Claim, owner string, won bool, lease core.Lease) {
	c.mu.Lock()
	if c.m[key] == cl {
		delete(c.m, key)
	}
	c.mu.Unlock()
	if won {
		cl.won = &core.Info{Key: key, Owner: owner, Token: lease.Token, AcquiredAt: lease.AcquiredAt, ExpiresAt: lease.ExpiresAt}
	}
	close(cl.done)
}

// Lead runs claim, the claim cl of key that the caller leads (Begin), and
// ends cl with its answer (End; won when claim returns no error, for
// owner), also when claim panics.
func (c *Claims) Lead(key string, cl *Claim, owner string, claim func() (core.Lease, error)) (lease core.Lease, err error) {
	won := false
	defer func() { c.End(key, cl, owner, won, lease) }()
	lease, err = claim()
	won = err == nil
	return lease, err
}

// Wait waits for cl's answer, or for ctx to end (its error then, as
// core.Unclaimed: the caller sent nothing). It returns the busy answer for
// key when cl won, and nil when the caller must ask the store itself.
func (cl *Claim) Wait(ctx context.Context, key string) error {
	cl.waiting.Add(1)
	defer cl.waiting.Add(-1)
	select {
	case <-cl.done:
	case <-ctx.Done():
		return core.Unclaimed(context.Cause(ctx))
	}
	if cl.won == nil {
		return nil
	}
	info := *cl.won
	info.Remaining = max(time.Until(info.ExpiresAt), 0)
	return core.Busy(key, &info)
}

// Waiting returns how many tries wait for the claim of key on its way (for
// tests).
func (c *Claims) Waiting(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl := c.m[key]; cl != nil {
		return int(cl.waiting.Load())
	}
	return 0
}

// OnItsWay reports whether a claim of key is on its way (for tests).
func (c *Claims) OnItsWay(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[key] != nil
}
