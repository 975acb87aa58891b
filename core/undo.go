package core

import (
	"context"
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

// undo releases an ambiguous claim of key by owner token, so that nothing
// stays held until its TTL. The claim was sent at sent and, if the store
// applied it, lives there for life unless renewed. A first release is sent
// at once. When it fails — the network is still down, say — it is retried
// in the background with backoff until the claim would have expired anyway;
// when the backend is a ClaimBounder, one more release follows once the
// claim can no longer take effect. Close cuts the retries short after one
// last attempt — sent once the claim bound has passed, if one is owed — and
// waits for them.
func (c *Client) undo(ctx context.Context, key, ownerToken string, sent time.Time, life time.Duration) {
	ctx = context.WithoutCancel(ctx)
	err := c.releaseDetached(ctx, key, ownerToken)
	var after time.Time // a release is still owed at or after this instant
	if cb, ok := c.b.(ClaimBounder); ok {
		if d := cb.ClaimBound(); d > 0 && d < life {
			after = sent.Add(d)
		}
	}
	end := sent.Add(life)
	now := time.Now()
	if (err == nil && !now.Before(after)) || !now.Before(end) {
		return
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		for n := 0; ; n++ {
			wait := backoffWait(undoBackoffMin, undoBackoffMax, n)
			if err == nil {
				wait = time.Until(after) // only the repeat after the claim bound is owed
			}
			if d := time.Until(end); wait > d {
				wait = d
			}
			closing := sleepCtx(c.closing, wait) != nil
			if closing && time.Now().Before(after) {
				// The last attempt must come after the claim bound, or
				// a claim still running in the store outlives it.
				time.Sleep(time.Until(after))
			}
			err = c.releaseDetached(ctx, key, ownerToken)
			now := time.Now()
			if closing || (err == nil && !now.Before(after)) || !now.Before(end) {
				return
			}
		}
	}()
}
