package core

import (
	"context"
	"errors"
	mrand "math/rand/v2"
	"time"
)

// renewBatch is one Backend.Renew call in flight.
type renewBatch struct {
	sent     time.Time
	sessions []*session
	results  []error
	err      error
}

// renewLoop is the Client's one renewer goroutine. It renews every lease
// whose renewal is due, coalescing those due within half an interval into one
// Backend.Renew call, and ends sessions whose local deadline passes, whether
// or not a renewal is in flight.
func (c *Client) renewLoop() {
	defer c.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	results := make(chan *renewBatch, 1)
	inflight := false
	for {
		now := time.Now()
		var due []*session
		anyDue := false
		c.mu.Lock()
		// Even with nothing due, wake within the shortest renew interval
		// seen, so that a new lease never needs to wake this goroutine.
		next := now.Add(time.Hour)
		if c.idle > 0 {
			next = now.Add(c.idle)
		}
		for s := range c.sessions {
			s.mu.Lock()
			if !now.Before(s.deadline) {
				s.mu.Unlock()
				// lose takes c.mu through unregister: do it outside.
				due = append(due, s)
				continue
			}
			if s.deadline.Before(next) {
				next = s.deadline
			}
			if !s.slot && !s.inflight && !inflight {
				if !now.Before(s.nextRenew) {
					anyDue = true
				}
				if s.nextRenew.Before(next) {
					next = s.nextRenew
				}
			}
			s.mu.Unlock()
		}
		c.nextWake = next
		var batch *renewBatch
		if anyDue {
			batch = &renewBatch{sent: now}
			for s := range c.sessions {
				s.mu.Lock()
				if !s.slot && !s.inflight && now.Before(s.deadline) && s.nextRenew.Sub(now) <= s.interval/2 {
					s.inflight = true
					batch.sessions = append(batch.sessions, s)
				}
				s.mu.Unlock()
			}
		}
		c.mu.Unlock()

		for _, s := range due {
			c.expire(s)
		}
		if batch != nil && len(batch.sessions) > 0 {
			inflight = true
			c.wg.Add(1)
			go c.sendRenewals(batch, results)
		}
		if len(due) > 0 || batch != nil {
			continue
		}

		timer.Reset(time.Until(next))
		select {
		case <-c.ctx.Done():
			if inflight {
				c.finishBatch(<-results)
			}
			return
		case <-c.wake:
		case <-timer.C:
		case b := <-results:
			inflight = false
			c.finishBatch(b)
		}
	}
}

// expire ends a session whose local deadline passed.
func (c *Client) expire(s *session) {
	if s.slot {
		s.lose(errors.New("slot ended"))
		return
	}
	s.lose(errors.New("renew deadline passed without a successful renewal"))
	// The store may still hold the lease (a slow network, say): free it
	// for the next holder rather than leave it to its TTL.
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		_ = c.releaseDetached(s.obsCtx, s.key, s.ownerToken)
	}()
}

// sendRenewals runs one batched renewal and hands the result back.
func (c *Client) sendRenewals(b *renewBatch, out chan<- *renewBatch) {
	defer c.wg.Done()
	reqs := make([]RenewRequest, len(b.sessions))
	last := b.sent
	for i, s := range b.sessions {
		reqs[i] = RenewRequest{Key: s.key, OwnerToken: s.ownerToken, TTL: s.ttl}
		if d := s.Deadline(); d.After(last) {
			last = d
		}
	}
	ctxs := make([]context.Context, len(b.sessions))
	if c.obs != nil {
		for i, s := range b.sessions {
			ctxs[i] = c.obs.RenewStart(s.obsCtx, RenewStartEvent{Backend: c.name, Key: s.key, Token: s.token})
		}
	}
	// No renewal is useful after the last deadline in the batch.
	ctx, cancel := context.WithDeadline(c.ctx, last)
	b.results, b.err = c.b.Renew(ctx, reqs)
	cancel()
	if b.err == nil && len(b.results) != len(reqs) {
		b.err = errors.New("dislock: backend returned the wrong number of renewal results")
	}
	if c.obs != nil {
		for i, s := range b.sessions {
			c.obs.RenewEnd(ctxs[i], RenewEndEvent{Backend: c.name, Key: s.key, Token: s.token, Err: b.itemErr(i)})
		}
	}
	out <- b
}

func (b *renewBatch) itemErr(i int) error {
	if b.err != nil {
		return b.err
	}
	return b.results[i]
}

// finishBatch applies a batch's outcome to its sessions.
func (c *Client) finishBatch(b *renewBatch) {
	for i, s := range b.sessions {
		err := b.itemErr(i)
		s.mu.Lock()
		s.inflight = false
		ended := s.err != nil
		switch {
		case ended:
		case err == nil:
			s.failures = 0
			// The lease runs from the send time, the earliest instant the
			// store could have applied the renewal.
			if d := b.sent.Add(s.renewDeadline); d.After(s.deadline) {
				s.deadline = d
			}
			s.nextRenew = b.sent.Add(s.interval)
		case errors.Is(err, ErrLeaseLost):
		default:
			// Outcome unknown: retry soon, jittered, until the deadline.
			s.failures++
			s.nextRenew = time.Now().Add(retryDelay(s.ttl))
		}
		s.mu.Unlock()
		if !ended && err != nil && errors.Is(err, ErrLeaseLost) {
			s.lose(err)
		}
	}
}

// retryDelay spaces renewal retries about TTL/10 apart, jittered ±50%.
func retryDelay(ttl time.Duration) time.Duration {
	base := ttl / 10
	if base < time.Millisecond {
		base = time.Millisecond
	}
	return base/2 + mrand.N(base+1)
}
