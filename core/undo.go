package core

import (
	"context"
	"slices"
	"time"
)

// ClaimBounder is implemented by backends whose store may still apply a
// claim for a while after the client stopped waiting for its reply: a
// statement that runs on in the server after its client gave up, say. The
// engine then repeats the undo of an ambiguous claim once ClaimBound has
// passed since the claim was sent, so that the undo cannot be overtaken by
// the claim it undoes. A backend that implements it makes sure its store
// abandons a claim that has not taken effect within ClaimBound.
type ClaimBounder interface {
	ClaimBound() time.Duration
}

// Undo retries are spaced by this backoff, jittered, until the claim's life
// runs out.
const (
	undoBackoffMin = 50 * time.Millisecond
	undoBackoffMax = 2 * time.Second
)

// closeUndoWait bounds how long Close waits for claim bounds to pass.
const closeUndoWait = 10 * time.Second

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// pendingUndo is an ambiguous claim whose undo is still owed.
type pendingUndo struct {
	ctx             context.Context
	key, ownerToken string
	limit           int
	after           time.Time // one release is owed at or after this instant (the claim bound)
	end             time.Time // after this the store has dropped the claim anyway
	due             time.Time // next attempt
	failures        int
}

// undo releases an ambiguous claim of key by owner token, so that nothing
// stays held until its TTL. The claim was sent at sent and, if the store
// applied it, lives there for life (from when it was applied) unless
// renewed. A first release is sent at once, in the background: the
// returned channel is closed when it has returned, and an acquisition
// waits for it only within its budget. When it fails — the network is
// still down, say — it is retried in the background with backoff until
// the claim would have expired anyway; when the backend is a ClaimBounder,
// one more release follows once the claim can no longer take effect. One
// goroutine per Client serves every pending undo, and a round of retries
// stops at its first failure, so an outage costs about one release per
// backoff step, however many claims are pending. Close waits for the first
// releases, makes one last attempt for each pending undo — sent once the
// claim bound has passed, if one is owed — and waits for them.
func (c *Client) undo(ctx context.Context, key, ownerToken string, limit int, sent time.Time, life time.Duration) <-chan struct{} {
	ctx = context.WithoutCancel(ctx)
	var bound time.Duration
	if cb, ok := c.b.(ClaimBounder); ok {
		bound = max(cb.ClaimBound(), 0)
	}
	u := &pendingUndo{ctx: ctx, key: key, ownerToken: ownerToken, limit: limit, end: sent.Add(bound + life)}
	if bound > 0 {
		u.after = sent.Add(bound)
	}
	done := make(chan struct{})
	if !c.startCall() {
		close(done) // Close has closed, or is closing, the backend
		return done
	}
	go func() {
		defer c.endCall()
		defer close(done)
		err := c.releaseDetached(ctx, key, ownerToken, limit)
		now := time.Now()
		if !u.owed(err, now) {
			return
		}
		u.schedule(err, now)
		c.pend(u)
	}()
	return done
}

// pend hands u to the undo goroutine, starting it if need be. It runs on a
// counted store call (startCall): unless Close gave up waiting for such
// calls (the undo is then dropped, and the claim expires at its TTL),
// Close has not begun to wait for the goroutine yet.
func (c *Client) pend(u *pendingUndo) {
	c.mu.Lock()
	if c.callsCut {
		c.mu.Unlock()
		return
	}
	c.undos = append(c.undos, u)
	start := !c.undoing
	c.undoing = true
	if start {
		c.wg.Add(1)
	}
	c.mu.Unlock()
	if start {
		go c.undoLoop()
	} else {
		select {
		case c.undoWake <- struct{}{}:
		default:
		}
	}
}

// owed reports whether u still needs a release after an attempt that
// returned err at now.
func (u *pendingUndo) owed(err error, now time.Time) bool {
	if !now.Before(u.end) {
		return false
	}
	return err != nil || now.Before(u.after)
}

// schedule sets u's next attempt after one that returned err.
func (u *pendingUndo) schedule(err error, now time.Time) {
	if err == nil {
		u.due = u.after // only the repeat after the claim bound is owed
		return
	}
	u.failures++
	u.due = now.Add(backoffWait(undoBackoffMin, undoBackoffMax, u.failures-1))
}

// undoLoop serves the Client's pending undos until none is left.
func (c *Client) undoLoop() {
	defer c.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		c.mu.Lock()
		if len(c.undos) == 0 {
			c.undoing = false
			c.mu.Unlock()
			return
		}
		list := slices.Clone(c.undos)
		c.mu.Unlock()
		slices.SortFunc(list, func(a, b *pendingUndo) int { return a.due.Compare(b.due) })

		if c.closing.Err() != nil {
			// Close: one last attempt each, none before its claim bound
			// (waiting at most closeUndoWait for it).
			limit := time.Now().Add(closeUndoWait)
			for _, u := range list {
				if d := time.Until(minTime(u.after, limit)); d > 0 {
					time.Sleep(d)
				}
				_ = c.releaseDetached(u.ctx, u.key, u.ownerToken, u.limit)
			}
			c.dropUndos(list)
			continue
		}
		now := time.Now()
		if d := list[0].due.Sub(now); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-c.undoWake:
			case <-c.closing.Done():
			}
			continue
		}
		var done []*pendingUndo
		for _, u := range list {
			if u.due.After(now) {
				break
			}
			err := c.releaseDetached(u.ctx, u.key, u.ownerToken, u.limit)
			now = time.Now()
			if !u.owed(err, now) {
				done = append(done, u)
				continue
			}
			u.schedule(err, now)
			if err != nil {
				// The store is likely still out of reach: the others would
				// fail too. Try them after this one's backoff.
				for _, o := range list {
					if o != u && o.due.Before(u.due) && !slices.Contains(done, o) {
						o.due = u.due
					}
				}
				break
			}
		}
		c.dropUndos(done)
	}
}

// dropUndos forgets the pending undos in list.
func (c *Client) dropUndos(list []*pendingUndo) {
	if len(list) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.undos = slices.DeleteFunc(c.undos, func(u *pendingUndo) bool { return slices.Contains(list, u) })
}
