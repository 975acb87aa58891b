package core

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// DeadlineSlack is how long after its ctx ends TryAcquire and Acquire may
// still keep their caller, whatever the store does: a store call that has
// not returned by then is left to finish in the background (a claim it
// makes after the caller left is undone by owner token; a ContextBound
// backend's call has returned by then on its own), and so are the
// undo of a claim left in doubt and a waiter's leaving the store's queue.
// Close waits for all of them.
const DeadlineSlack = 100 * time.Millisecond

// budget is how long an acquisition may keep its caller: until ctx ends,
// then DeadlineSlack more.
type budget struct {
	ctx  context.Context
	over time.Time // when ctx was seen to end, plus the slack; zero until then
}

// wait waits for done until the budget is spent, and reports whether done
// was closed.
func (b *budget) wait(done <-chan struct{}) bool {
	if b.over.IsZero() {
		select {
		case <-done:
			return true
		case <-b.ctx.Done():
			b.over = time.Now().Add(DeadlineSlack)
		}
	}
	select {
	case <-done:
		return true
	default:
	}
	return waitClosed(done, time.Until(b.over))
}

// waitClosed waits up to d for ch to be closed, and reports whether it was.
func waitClosed(ch <-chan struct{}, d time.Duration) bool {
	if d <= 0 {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}

// startCall counts a store call that may outlive the acquisition that made
// it; false when Close no longer waits for such calls (it runs then only
// what it must not drop, or nothing). endCall ends it.
func (c *Client) startCall() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.callsCut {
		return false
	}
	c.calls++
	return true
}

func (c *Client) endCall() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls--
	if c.calls == 0 && c.callsIdle != nil {
		close(c.callsIdle)
		c.callsIdle = nil
	}
}

// waitCalls waits up to d for the store calls in flight to end, and
// reports whether they did.
func (c *Client) waitCalls(d time.Duration) bool {
	c.mu.Lock()
	if c.calls == 0 {
		c.mu.Unlock()
		return true
	}
	if c.callsIdle == nil {
		c.callsIdle = make(chan struct{})
	}
	idle := c.callsIdle
	c.mu.Unlock()
	return waitClosed(idle, d)
}

// cutCalls makes calls that are still in flight drop their late results:
// Close is about to close the backend.
func (c *Client) cutCalls() {
	c.mu.Lock()
	c.callsCut = true
	c.mu.Unlock()
}

// errNoReply is the failure of a store call that had not returned
// DeadlineSlack after its ctx ended.
type errNoReply struct{}

func (errNoReply) Error() string {
	return fmt.Sprintf("no reply %v after the context ended", DeadlineSlack)
}

// call states
const (
	callPending = iota
	callDelivered
	callAbandoned
)

// storeCall runs fn on one of the client's call workers and returns its
// result, or, when fn has not returned within the budget, an errNoReply:
// fn then finishes in the background and late gets its result (late may
// be nil). Close waits for it.
func storeCall[T any](c *Client, bud *budget, fn func() (T, error), late func(T, error)) (T, error) {
	var zero T
	if !c.startCall() {
		return zero, ErrClosed
	}
	t := &callTask[T]{c: c, fn: fn, late: late, done: make(chan struct{})}
	c.runCall(t)
	if bud.wait(t.done) || !t.state.CompareAndSwap(callPending, callAbandoned) {
		<-t.done
		return t.v, t.err
	}
	return zero, errNoReply{}
}

// ctxCall is storeCall for a call that runs on bud's ctx: made on the
// caller's goroutine when the backend ends its calls with their ctx (see
// ContextBound), which then keeps the caller within bud itself.
func ctxCall[T any](c *Client, bud *budget, fn func() (T, error), late func(T, error)) (T, error) {
	if !c.endsWithCtx {
		return storeCall(c, bud, fn, late)
	}
	if !c.startCall() {
		var zero T
		return zero, ErrClosed
	}
	defer c.endCall()
	return fn()
}

// callTask is one store call handed to a call worker.
type callTask[T any] struct {
	c     *Client
	fn    func() (T, error)
	late  func(T, error)
	state atomic.Int32
	done  chan struct{}
	v     T
	err   error
}

func (t *callTask[T]) run() {
	defer t.c.endCall()
	v, err := t.fn()
	t.v, t.err = v, err
	if t.state.CompareAndSwap(callPending, callDelivered) {
		close(t.done)
		return
	}
	if t.late != nil {
		t.late(v, err)
	}
}

// runner is a task for a call worker.
type runner interface{ run() }

// workerIdle is how long a call worker waits for its next store call
// before it exits. Store calls run on workers rather than on a goroutine
// each, so that the stack a store's call path grows is kept from one call
// to the next; an idle client keeps none (and Close stops them all).
const workerIdle = 100 * time.Millisecond

// runCall hands t to an idle call worker, or starts one for it.
func (c *Client) runCall(t runner) {
	select {
	case c.work <- t:
	default:
		go c.callWorker(t)
	}
}

// callWorker runs t, then the store calls handed to it, until it has been
// idle for workerIdle or Close stops the workers.
func (c *Client) callWorker(t runner) {
	t.run()
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		select {
		case t := <-c.work:
			t.run()
			idle.Reset(workerIdle)
		case <-idle.C:
			return
		case <-c.workStop:
			return
		}
	}
}
