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
	timedOut bool // the call ran out of its time bound
}

// renewLoop is the Client's one renewer goroutine. It renews every lease
// whose renewal is due, coalescing into one Backend.Renew call those due
// within half their interval, and those due within the shortest interval of
// the leases due (all of the leases of that interval, whenever they were
// taken): leases taken over more than half an interval then share one call
// per interval from their first renewal on, instead of two calls until the
// window brings them together. It ends sessions whose local deadline
// passes, whether or not a renewal is in flight.
//
// Several calls may be in flight at once, so that one slow key never holds
// up the renewal of another; a session is in at most one of them. A call's
// wait is bounded by the earliest deadline among its sessions (see
// renewBound). When a call for several sessions fails as a whole — it hung,
// or the store failed it — its sessions are split into up to splitWays
// groups that are renewed apart until they succeed, so that a key that
// fails every call it is in is isolated from the healthy ones within a few
// attempts (four for 10,000 leases), while a store that stalls for everyone
// sees a few more calls per attempt rather than one per lease.
func (c *Client) renewLoop() {
	defer c.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	results := make(chan *renewBatch)
	inflight := 0
	for {
		now := time.Now()
		var due []*session
		anyDue := false
		var trig time.Duration // the shortest interval among the sessions due
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
			if !s.slot && !s.inflight && !s.releasing {
				if !now.Before(s.nextRenew) {
					anyDue = true
					if trig == 0 || s.interval < trig {
						trig = s.interval
					}
				}
				if s.nextRenew.Before(next) {
					next = s.nextRenew
				}
			}
			s.mu.Unlock()
		}
		c.nextWake = next
		var batches []*renewBatch
		if anyDue {
			shared := &renewBatch{sent: now}
			var groups map[uint64]*renewBatch
			for s := range c.sessions {
				s.mu.Lock()
				if !s.slot && !s.inflight && !s.releasing && now.Before(s.deadline) && s.nextRenew.Sub(now) <= max(s.interval/2, min(s.interval, trig)) {
					s.inflight = true
					s.lastSent = now
					if s.group == 0 {
						shared.sessions = append(shared.sessions, s)
					} else {
						if groups == nil {
							groups = make(map[uint64]*renewBatch)
						}
						g := groups[s.group]
						if g == nil {
							g = &renewBatch{sent: now}
							groups[s.group] = g
							batches = append(batches, g)
						}
						g.sessions = append(g.sessions, s)
					}
				}
				s.mu.Unlock()
			}
			if len(shared.sessions) > 0 {
				batches = append(batches, shared)
			}
		}
		c.mu.Unlock()

		for _, s := range due {
			c.expire(s)
		}
		for _, b := range batches {
			inflight++
			c.wg.Add(1)
			go c.sendRenewals(b, results)
		}
		if len(due) > 0 || len(batches) > 0 {
			continue
		}

		timer.Reset(time.Until(next))
		select {
		case <-c.ctx.Done():
			for ; inflight > 0; inflight-- {
				c.finishBatch(<-results)
			}
			return
		case <-c.wake:
		case <-timer.C:
		case b := <-results:
			inflight--
			c.finishBatch(b)
		}
	}
}

// expire ends a session whose local deadline passed. The store may still
// hold the key — the network may be slow rather than down — and keeps it
// until its TTL runs out: the margin TTL − RenewDeadline is the holder's, to
// stop its work. Only the holder's Release on the lost session (meaning: the
// work has stopped) frees the key early. A session whose Release is in
// flight owes none: that Release is it.
func (c *Client) expire(s *session) {
	if s.slot {
		s.lose(errors.New("slot ended"), false)
		return
	}
	s.mu.Lock()
	releasing := s.releasing
	s.mu.Unlock()
	if releasing {
		s.lose(errors.New("renew deadline passed while the release was in flight"), false)
		return
	}
	s.lose(errors.New("renew deadline passed without a successful renewal"), true)
}

// renewBound is when a renewal call sent at sent for sessions ss stops
// waiting. A call for one session waits until that session's deadline: no
// answer after it is of use. A call for several waits at most half the time
// left to the most urgent of them, so that if one key hangs the others
// still have time to be renewed on their own.
func renewBound(sent time.Time, ss []*session) time.Time {
	first := ss[0].Deadline()
	for _, s := range ss[1:] {
		if d := s.Deadline(); d.Before(first) {
			first = d
		}
	}
	if len(ss) == 1 {
		return first
	}
	return sent.Add(first.Sub(sent) / 2)
}

// sendRenewals runs one batched renewal and hands the result back.
func (c *Client) sendRenewals(b *renewBatch, out chan<- *renewBatch) {
	defer c.wg.Done()
	reqs := make([]RenewRequest, len(b.sessions))
	for i, s := range b.sessions {
		reqs[i] = RenewRequest{Key: s.key, OwnerToken: s.ownerToken, TTL: s.ttl, Limit: s.limit}
	}
	ctxs := make([]context.Context, len(b.sessions))
	bctx := c.ctx // the store call's context
	bo, _ := c.obs.(RenewBatchObserver)
	var sctxs []context.Context
	if c.obs != nil {
		starts := make([]RenewStartEvent, len(b.sessions))
		for i, s := range b.sessions {
			starts[i] = RenewStartEvent{Backend: c.name, Key: s.key, Token: s.token}
		}
		if bo != nil {
			sctxs = make([]context.Context, len(b.sessions))
			for i, s := range b.sessions {
				sctxs[i] = s.obsCtx
			}
			bctx = bo.RenewBatchStart(bctx, RenewBatchStartEvent{Backend: c.name, Renewals: starts, Contexts: sctxs})
		}
		for i, s := range b.sessions {
			ctxs[i] = c.obs.RenewStart(s.obsCtx, starts[i])
		}
	}
	ctx, cancel := context.WithDeadline(bctx, renewBound(b.sent, b.sessions))
	b.results, b.err = c.b.Renew(ctx, reqs)
	b.timedOut = ctx.Err() == context.DeadlineExceeded
	cancel()
	if b.err == nil && len(b.results) != len(reqs) {
		b.err = errors.New("dislock: backend returned the wrong number of renewal results")
	}
	if c.obs != nil {
		ends := make([]RenewEndEvent, len(b.sessions))
		for i, s := range b.sessions {
			ends[i] = RenewEndEvent{Backend: c.name, Key: s.key, Token: s.token, Err: b.itemErr(i)}
			c.obs.RenewEnd(ctxs[i], ends[i])
		}
		if bo != nil {
			bo.RenewBatchEnd(bctx, RenewBatchEndEvent{Backend: c.name, Renewals: ends, Contexts: sctxs, Err: b.err})
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

// splitWays is how many groups the sessions of a failed renewal call are
// split into.
const splitWays = 16

// finishBatch applies a batch's outcome to its sessions. It runs on the
// renewer goroutine only.
func (c *Client) finishBatch(b *renewBatch) {
	now := time.Now()
	ways := 0
	if b.err != nil && len(b.sessions) > 1 {
		ways = min(len(b.sessions), splitWays)
		c.groupSeq += uint64(ways)
	}
	for i, s := range b.sessions {
		err := b.itemErr(i)
		s.mu.Lock()
		s.inflight = false
		ended := s.err != nil
		switch {
		case ended:
		case err == nil:
			s.failures = 0
			s.group = 0
			// The lease runs from the send time, the earliest instant the
			// store could have applied the renewal.
			if d := b.sent.Add(s.renewDeadline); d.After(s.deadline) {
				s.deadline = d
			}
			s.nextRenew = b.sent.Add(s.interval)
		case errors.Is(err, ErrLeaseLost):
		default:
			// Outcome unknown: retry until the deadline — soon after the
			// failed call's send, jittered, and so at once after a call
			// that took as long (it hung until a bound of its own or of
			// the backend's, its wait is spent) — in a smaller group when
			// the whole call failed, so that whatever failed it cannot
			// fail the others again.
			s.failures++
			if ways > 0 {
				s.group = c.groupSeq - uint64(i%ways)
			}
			s.nextRenew = b.sent.Add(retryDelay(s.ttl))
			if b.timedOut || s.nextRenew.Before(now) {
				s.nextRenew = now
			}
		}
		s.mu.Unlock()
		if !ended && err != nil && errors.Is(err, ErrLeaseLost) {
			s.lose(err, false)
		}
	}
}

// retryDelay spaces renewal retries about TTL/10 apart, send to send,
// jittered ±50%.
func retryDelay(ttl time.Duration) time.Duration {
	base := ttl / 10
	if base < time.Millisecond {
		base = time.Millisecond
	}
	return base/2 + mrand.N(base+1)
}
