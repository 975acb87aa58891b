package core

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// session is the engine's Session.
type session struct {
	c                      *Client
	key, owner, ownerToken string
	token                  uint64
	limit                  int // semaphore permits; 0 for a mutex
	slot                   bool
	ttl, interval          time.Duration
	renewDeadline, minHold time.Duration
	acquiredAt             time.Time       // local, monotonic
	obsCtx                 context.Context // the observer's context (nil without an observer)
	userCtx                context.Context // the acquiring ctx: the values of the session's Context
	ctx                    atomic.Pointer[sessionCtx]
	done                   chan struct{}

	mu         sync.Mutex
	deadline   time.Time // local, monotonic
	lastSent   time.Time // send time of the latest renewal, whatever its outcome
	nextRenew  time.Time
	failures   int    // consecutive renewals with unknown outcome
	inflight   bool   // part of a renewal batch in flight
	group      uint64 // renewal group after a failed call (0: the shared batch); see finishBatch
	err        error
	unreleased bool // ended locally, server release still owed
	releasing  bool // Release was called while held: its store call is this session's last
}

var _ Session = (*session)(nil)

func (s *session) Key() string           { return s.key }
func (s *session) Token() uint64         { return s.token }
func (s *session) Owner() string         { return s.owner }
func (s *session) Done() <-chan struct{} { return s.done }

// sessionCtx is a session's Context, made at its first call.
type sessionCtx struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// Context implements Session. The context is made at the first call, so
// that a session whose holder never asks for it costs none: it is
// cancelled at once when the session has ended, else by end.
func (s *session) Context() context.Context {
	if x := s.ctx.Load(); x != nil {
		return x.ctx
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if x := s.ctx.Load(); x != nil {
		return x.ctx
	}
	x := new(sessionCtx)
	x.ctx, x.cancel = context.WithCancelCause(detach(s.userCtx)) // the session outlives the caller's ctx
	if s.err != nil {
		x.cancel(s.err)
	}
	s.ctx.Store(x)
	return x.ctx
}
func (s *session) Deadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deadline
}

// storeExpiry is the local instant by which the store has surely dropped
// the lease if nothing renewed it: the send time of the last successful
// acquire or renewal plus the TTL.
func (s *session) storeExpiry() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.slot {
		return s.deadline
	}
	// The latest renewal sent may have been applied even if its reply
	// never came.
	last := s.deadline.Add(-s.renewDeadline)
	if s.lastSent.After(last) {
		last = s.lastSent
	}
	return last.Add(s.ttl)
}

func (s *session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// end marks the session ended with cause; it reports whether this call ended
// it. before, if set, runs after the session is marked ended and before Done
// closes, so that whoever waits on Done sees its effects.
func (s *session) end(cause error, owesRelease bool, before func()) bool {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return false
	}
	s.err = cause
	s.unreleased = owesRelease
	s.mu.Unlock()
	s.c.unregister(s, owesRelease && !isReleased(cause))
	if before != nil {
		before()
	}
	// A Context made from now on is cancelled when it is made.
	if x := s.ctx.Load(); x != nil {
		x.cancel(cause)
	}
	close(s.done)
	return true
}

// lose ends the session with a lease-loss error and tells the observer.
// owesRelease is true when the store may still hold the key (the renew
// deadline passed): it stays held until its TTL, or until the holder calls
// Release to say its work has stopped.
func (s *session) lose(reason error, owesRelease bool) {
	cause := reason
	if !isLeaseLost(reason) {
		cause = fmt.Errorf("%w: %q: %w", ErrLeaseLost, s.key, reason)
	}
	var tell func()
	if o := s.c.obs; o != nil {
		tell = func() {
			o.Lost(s.obsCtx, LostEvent{Backend: s.c.name, Key: s.key, Token: s.token, Held: time.Since(s.acquiredAt), Err: cause})
		}
	}
	s.end(cause, owesRelease, tell)
}

// Release implements Session.
func (s *session) Release(ctx context.Context) error { return s.release(ctx, ErrReleased) }

// release gives the lease up and ends the session with cause (ErrReleased,
// or ErrClosed from Close). A session still held is renewed no more, and
// ended only once the store has answered (or as lost at its deadline), so
// that a store that finds nothing of this lease's (Gone: force-released,
// expired, taken over) ends it as lost instead, and the caller hears of it. A session that already
// ended owes at most the store's release of a key it may still hold (lost
// at its renew deadline, or an earlier release that failed); a Gone answer
// then means that there is nothing left to free.
func (s *session) release(ctx context.Context, cause error) error {
	s.mu.Lock()
	held := s.err == nil && !s.releasing
	owe := held || s.unreleased
	s.releasing = s.releasing || held
	s.unreleased = false
	s.mu.Unlock()
	if !owe {
		return nil
	}
	c := s.c
	if !held {
		c.forget(s)
	}
	// A session still held stays with the renewer until it ends: renewed
	// no more (releasing), it is still ended as lost at its deadline, as
	// it would have been without the Release, if the store has not
	// answered by then.
	req := ReleaseRequest{Key: s.key, OwnerToken: s.ownerToken, Limit: s.limit, Token: s.token}
	heldFor := time.Since(s.acquiredAt)
	kept := s.slot
	if !s.slot && s.minHold > heldFor {
		req.Keep = s.minHold - heldFor
		kept = true
	}
	octx := s.obsCtx
	if c.obs != nil {
		octx = c.obs.ReleaseStart(octx, ReleaseStartEvent{Backend: c.name, Key: s.key, Token: s.token, Caller: ctx})
	}
	var err error
	if !s.slot { // a slot lock is kept until the slot ends: nothing to send
		var echo time.Time
		if !kept {
			echo = c.expectEcho(s.key)
		}
		rctx, cancel := context.WithTimeout(detach(ctx), c.cfg.releaseTimeout)
		err = c.b.Release(rctx, req)
		cancel()
		if err != nil {
			c.dropEcho(s.key, echo)
		} else if !kept {
			c.notify(s.key)
		}
	}
	switch {
	case err == nil:
		s.end(cause, false, nil)
		c.forget(s) // in case the renewer ended it meanwhile, owing a release
	case errors.Is(err, ErrLeaseGone):
		if held {
			// The store had nothing of this lease's any more: the session
			// was not exclusive to the end. (If a renewal found that out
			// meanwhile, the session already says so.)
			s.lose(err, false)
			err = s.Err()
		} else {
			err = nil // the loss was reported when the session ended
		}
	default:
		err = fmt.Errorf("dislock: %s: release %q: %w", c.name, s.key, err)
		s.end(cause, true, nil)
		s.mu.Lock()
		s.unreleased = true // a later Release may retry
		s.mu.Unlock()
		c.owe(s)
	}
	if c.obs != nil {
		c.obs.ReleaseEnd(octx, ReleaseEndEvent{Backend: c.name, Key: s.key, Token: s.token, Held: heldFor, Kept: kept, Err: err})
	}
	return err
}

// Check implements Session: one renewal of this lease alone, sent now.
func (s *session) Check(ctx context.Context) error {
	s.mu.Lock()
	err, releasing := s.err, s.releasing
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if releasing { // its holder gave it up: no renewal may follow the release
		return ErrReleased
	}
	if s.slot {
		// A slot lease is not renewed; the store keeps it until the slot
		// ends, which the local deadline tracks.
		if time.Now().Before(s.Deadline()) {
			return nil
		}
		return fmt.Errorf("%w: %q: slot ended", ErrLeaseLost, s.key)
	}
	c := s.c
	sent := time.Now()
	s.mu.Lock()
	if s.lastSent.Before(sent) {
		s.lastSent = sent // it may be applied whatever its outcome
	}
	s.mu.Unlock()
	ctx, cancel := context.WithDeadline(ctx, s.Deadline())
	defer cancel()
	res, err := c.b.Renew(ctx, []RenewRequest{{Key: s.key, OwnerToken: s.ownerToken, TTL: s.ttl, Limit: s.limit}})
	if err == nil {
		if len(res) != 1 {
			err = errors.New("dislock: backend returned the wrong number of renewal results")
		} else {
			err = res[0]
		}
	}
	switch {
	case err == nil:
		s.mu.Lock()
		if s.err == nil {
			if d := sent.Add(s.renewDeadline); d.After(s.deadline) {
				s.deadline = d
			}
		}
		ended := s.err
		s.mu.Unlock()
		return ended
	case errors.Is(err, ErrLeaseLost):
		s.lose(err, false)
		return s.Err()
	default:
		if e := s.Err(); e != nil {
			return e
		}
		if !time.Now().Before(s.Deadline()) {
			// Past the deadline the session may not act as the holder,
			// whatever the store would have said.
			c.expire(s)
			return s.Err()
		}
		return fmt.Errorf("dislock: %s: check %q: %w", c.name, s.key, err)
	}
}

func isLeaseLost(err error) bool { return err != nil && errors.Is(err, ErrLeaseLost) }
