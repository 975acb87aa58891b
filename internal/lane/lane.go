// Package lane lets the calls of one backend that meet share round trips.
//
// A Lane sends the calls of one Backend to its store. A call made while
// none of the lane's is on its way may be sent at once, on its caller's
// goroutine (Do's direct). Calls made while others are on their way wait in
// the lane's queue, and a sender sends everything queued as one batch,
// which the backend makes one round trip: a pipeline, one script call, one
// transaction. At most MaxSenders batches are on their way at once.
//
// A caller whose ctx ends while its call waits in the queue takes it out:
// it was never sent. Once taken into a batch, the call is sent; a caller
// whose ctx ends meanwhile returns at once without its outcome, as after a
// lost connection, and the batch goes on for the others. A release by the
// owner token of a claim left so waits for the claim's outcome (After), so
// that it comes after the claim it undoes.
package lane

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// MaxSenders is how many batches a lane has on their way at once: three,
// so that the store runs one batch while the client reads the replies of
// another and its callers queue the next, and no more, so that the batches
// under load are deep enough to share their round trips (64 callers on
// distinct Redis keys: batches of about 13 calls; the bench's pairs per
// second were no higher with 1, 2, 4 or 8 senders).
const MaxSenders = 3

// senderIdle is how long a sender waits for work before it exits. Senders
// outlive their batch so that a call is not made on a goroutine started for
// it, whose stack would grow anew each time.
const senderIdle = 100 * time.Millisecond

// Call is one call in a lane: V holds what the backend sends and, once
// sent, its outcome.
type Call[T any] struct {
	V        T
	ctx      context.Context
	token    string        // the owner token of a claim, else ""
	done     chan struct{} // receives once V holds the outcome
	taken    bool          // in a batch; Lane.mu guards it
	answered bool          // V holds its outcome; Lane.mu guards it
	left     bool          // its caller left it in a batch (Lane.mu)
}

// Ctx is the context of the call's caller.
func (c *Call[T]) Ctx() context.Context { return c.ctx }

// Lane sends the calls of one backend; see the package doc.
type Lane[T any] struct {
	one   func(ctx context.Context, v *T)
	batch func(ctx context.Context, calls []*Call[T])
	pool  sync.Pool

	mu      sync.Mutex
	busy    int // senders at work and calls sent directly, not yet answered
	queue   []*Call[T]
	wake    chan struct{} // hands the queue to an idle sender
	stop    chan struct{} // closed by Close: idle senders exit
	stopped bool

	// pending holds, by owner token, the claims on their way whose callers
	// left them.
	pending  map[string]*leftClaims
	npending atomic.Int32 // len(pending)
}

// leftClaims are the claims of one owner token on their way whose callers
// left them: done is closed once all n are answered.
type leftClaims struct {
	n    int
	done chan struct{}
}

// New returns a lane that sends a call on its own with one and a batch of
// two or more with batch. batch gets a context that no one caller's cancel
// ends, with the latest of their deadlines (see batchContext); it leaves
// each call's outcome in its V. A batch of one is sent with one, and its
// caller's ctx.
func New[T any](one func(ctx context.Context, v *T), batch func(ctx context.Context, calls []*Call[T])) *Lane[T] {
	l := &Lane[T]{one: one, batch: batch, wake: make(chan struct{}), stop: make(chan struct{}), pending: map[string]*leftClaims{}}
	l.pool.New = func() any { return &Call[T]{done: make(chan struct{}, 1)} }
	return l
}

// Get returns a Call to fill in and pass to Do.
func (l *Lane[T]) Get() *Call[T] { return l.pool.Get().(*Call[T]) }

// Put gives back c, whose outcome Do returned and the caller has read.
func (l *Lane[T]) Put(c *Call[T]) {
	*c = Call[T]{done: c.done}
	l.pool.Put(c)
}

// ErrUnsent wraps ctx's error when a caller left its call before it was
// sent: the store never saw it.
var ErrUnsent = errors.New("the call was not sent")

// Do sends c, made with Get, and returns when c.V holds its outcome, or
// when ctx ends first. token is the owner token of a claim, else "". With
// direct, a call made while the lane is idle is sent at once on the
// caller's goroutine.
//
// A non-nil error is ctx's: wrapped with ErrUnsent when c was taken out of
// the queue unsent (the caller may Put it back), else c was taken into a
// batch that is still on its way: c then belongs to the batch and must be
// neither read nor Put back, and a release of token waits for the claim's
// outcome (After).
func (l *Lane[T]) Do(ctx context.Context, c *Call[T], token string, direct bool) error {
	l.mu.Lock()
	if l.busy == 0 && direct {
		l.busy++
		l.mu.Unlock()
		l.one(ctx, &c.V)
		l.mu.Lock()
		l.busy--
		l.startSender()
		l.mu.Unlock()
		return nil
	}
	c.ctx, c.token = ctx, token
	l.queue = append(l.queue, c)
	l.startSender()
	l.mu.Unlock()
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
	}
	l.mu.Lock()
	switch {
	case c.answered: // at the same time as ctx's end
		l.mu.Unlock()
		<-c.done
		return nil
	case c.taken:
		c.left = true
		if token != "" {
			lc := l.pending[token]
			if lc == nil {
				lc = &leftClaims{done: make(chan struct{})}
				l.pending[token] = lc
				l.npending.Add(1)
			}
			lc.n++
		}
		l.mu.Unlock()
		return ctx.Err()
	}
	for i, o := range l.queue {
		if o == c {
			l.queue = append(l.queue[:i], l.queue[i+1:]...)
			break
		}
	}
	l.mu.Unlock()
	return errors.Join(ErrUnsent, ctx.Err())
}

// After waits until no claim of owner token is on its way whose caller
// left it (Do), or until ctx ends. A release that undoes such a claim
// then comes after it, and finds what it undoes: a claim still on its way
// on a connection that is being set up, say, could otherwise be applied
// after the release that was meant to undo it.
func (l *Lane[T]) After(ctx context.Context, token string) error {
	if l.npending.Load() == 0 {
		return nil
	}
	l.mu.Lock()
	lc := l.pending[token]
	l.mu.Unlock()
	if lc == nil {
		return nil
	}
	select {
	case <-lc.done:
		return nil
	case <-ctx.Done():
		return errors.Join(errors.New("the claim of this owner token is still on its way"), ctx.Err())
	}
}

// startSender sets a sender to work on the queue, when there is one and
// fewer than MaxSenders are at work. l.mu is held.
func (l *Lane[T]) startSender() {
	if len(l.queue) == 0 || l.busy >= MaxSenders {
		return
	}
	l.busy++
	select {
	case l.wake <- struct{}{}:
	default:
		go l.sender()
	}
}

// sender sends the queue, batch after batch, until it is empty, then
// waits for more until it has been idle for senderIdle or the lane is
// closed.
func (l *Lane[T]) sender() {
	var batch []*Call[T]
	var idle *time.Timer
	for {
		l.mu.Lock()
		batch, l.queue = l.queue, batch[:0]
		if len(batch) > 0 {
			for _, c := range batch {
				c.taken = true
			}
			l.mu.Unlock()
			l.send(batch)
			l.mu.Lock()
			for _, c := range batch {
				c.answered = true
				if lc := l.pending[c.token]; c.left && lc != nil {
					if lc.n--; lc.n == 0 {
						delete(l.pending, c.token)
						l.npending.Add(-1)
						close(lc.done)
					}
				}
			}
			l.mu.Unlock()
			for i, c := range batch {
				if !c.left {
					c.done <- struct{}{}
				}
				batch[i] = nil
			}
			continue
		}
		l.busy--
		stopped := l.stopped
		l.mu.Unlock()
		if stopped {
			return
		}
		if idle == nil {
			idle = time.NewTimer(senderIdle)
			defer idle.Stop()
		} else {
			idle.Reset(senderIdle)
		}
		select {
		case <-l.wake: // busy was counted for this sender
		case <-idle.C:
			return
		case <-l.stop:
			return
		}
	}
}

// send sends batch: a batch of one with its caller's ctx, others with
// batchContext.
func (l *Lane[T]) send(batch []*Call[T]) {
	if len(batch) == 1 { // its caller's own: it is nobody else's call
		l.one(batch[0].ctx, &batch[0].V)
		return
	}
	ctx, cancel := batchContext(batch)
	defer cancel()
	l.batch(ctx, batch)
}

// State reports how many senders are at work (with calls sent directly
// and not yet answered), how many calls are queued, and how many owner
// tokens have claims on their way whose callers left them; for tests.
func (l *Lane[T]) State() (busy, queued, pending int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.busy, len(l.queue), len(l.pending)
}

// Close makes idle senders exit, and busy ones when their queue is empty.
func (l *Lane[T]) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.stopped {
		l.stopped = true
		close(l.stop)
	}
}

// batchContext is the context a batch is sent with: not cancelled with
// any one caller's, and ending at the latest deadline of theirs (none when
// one of them has none), so that no caller's call is cut short by
// another's. It has the values of the first caller's ctx.
func batchContext[T any](batch []*Call[T]) (context.Context, context.CancelFunc) {
	var last time.Time
	for _, c := range batch {
		d, ok := c.ctx.Deadline()
		if !ok {
			return context.WithoutCancel(batch[0].ctx), func() {}
		}
		if d.After(last) {
			last = d
		}
	}
	return context.WithDeadline(context.WithoutCancel(batch[0].ctx), last)
}
