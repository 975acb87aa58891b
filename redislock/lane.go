package redislock

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// lane sends the claims, the releases and the clock reads of one Backend.
//
// Calls that meet in it share round trips. While calls are on their way,
// the calls made meanwhile wait in the lane's queue, and a sender sends
// everything queued as one pipeline: one write and one read for the batch,
// on both sides of the connection, where a busy client and server spend
// most of their time on a request's and a reply's system calls. At most
// maxSenders batches are on their way at once.
//
// A call whose caller must get its answer back by ctx's end (a claim or a
// clock read: go-redis cuts a call at its read timeout, and at ctx's
// deadline only with ContextTimeoutEnabled, never at a cancel) always goes
// through a sender, and its caller waits for the reply or for
// ctx, whichever comes first; the engine then makes claims on the caller's
// goroutine (core.ContextBound). Any other call made while the lane is idle
// (a release) is sent at once on its caller's goroutine, so a lone caller
// pays nothing for the lane.
//
// A batch is sent as sendOnce sends a command: its first attempt alone, a
// call that could not get a connection reported as never sent, and a call
// that failed in a way go-redis would retry sent again with go-redis's
// retries. A caller whose ctx ends while its call waits in the queue takes
// it out: it was never sent. Once taken into a batch, the call is sent; a
// caller whose ctx ends meanwhile returns at once without its reply, as
// after a lost connection, and the batch goes on for the others. A release
// by the owner token of a claim left so waits for the claim's answer
// (after).
//
// Clients other than *redis.Client, *redis.ClusterClient and *redis.Ring
// do not say whether they retry, so the lane sends each call on its own
// on its caller's goroutine, and the engine hands claims to its call
// workers.
type lane struct {
	c       redis.UniversalClient
	batch   bool // c sends pipelines, and honours NoRetry
	retries bool // c retries a failed command
	combine bool // c is one server: fastCalls go in one batch.lua call

	mu      sync.Mutex
	busy    int // senders at work and calls sent directly, not yet answered
	queue   []*queued
	wake    chan struct{} // hands the queue to an idle sender
	stop    chan struct{} // closed by close: idle senders exit
	stopped bool

	// pending holds, by owner token, the claims on their way whose callers
	// left them.
	pending  map[string]*leftClaims
	npending atomic.Int32 // len(pending)
}

// maxSenders is how many batches a lane has on their way at once: three,
// so that the server runs one batch while the client reads the replies of
// another and its callers queue the next, and no more, so that the batches
// under load are deep enough to share their round trips (64 callers on
// distinct keys: batches of about 13 calls; the bench's pairs per second
// were no higher with 1, 2, 4 or 8 senders).
const maxSenders = 3

// senderIdle is how long a sender waits for work before it exits. Senders
// outlive their batch so that a call is not made on a goroutine started for
// it, whose stack would grow anew each time.
const senderIdle = 100 * time.Millisecond

// queued is a call waiting in a lane's queue.
type queued struct {
	ctx      context.Context
	cmd      redis.Cmder
	token    string        // the owner token of a claim, else ""
	fast     fastCall      // the call as batch.lua takes it (kind 0: none)
	done     chan struct{} // receives once cmd holds its outcome
	taken    bool          // in a batch; l.mu guards it
	answered bool          // cmd holds its outcome; l.mu guards it
	left     bool          // its caller left it in a batch (l.mu)
	unsent   bool
}

// fastCall is a call that batch.lua can make, passed by value so that a
// call sent on its own allocates nothing for it: a plain claim (kind 'c':
// owner token, owner, TTL) or a release whose lease's token is known (kind
// 'r': owner token, fencing token, ""), of the lock at lock whose queue is
// at queue.
type fastCall struct {
	kind        byte
	lock, queue string
	a, b, c     any
}

// leftClaims are the claims of one owner token on their way whose callers
// left them: done is closed once all n are answered.
type leftClaims struct {
	n    int
	done chan struct{}
}

// queuedPool keeps the queued of the calls that got their reply.
var queuedPool = sync.Pool{New: func() any { return &queued{done: make(chan struct{}, 1)} }}

func newLane(c redis.UniversalClient) *lane {
	l := &lane{c: c, wake: make(chan struct{}), stop: make(chan struct{}), pending: map[string]*leftClaims{}}
	l.batch, l.retries = retryPolicy(c)
	return l
}

// send sends cmd and reports whether it failed before it reached the
// server, as sendOnce does. bound says that the call must end with ctx
// (see lane); token is the owner token of a claim, else "". A non-nil
// error is ctx's, after the call was taken into a batch that is still on
// its way: cmd then belongs to the batch and must not be read, and a
// release of token waits for the claim's answer (after).
func (l *lane) send(ctx context.Context, cmd redis.Cmder, bound bool, token string, fast fastCall) (unsent bool, err error) {
	if !l.batch {
		return sendOnce(ctx, l.c, cmd), nil
	}
	l.mu.Lock()
	if l.busy == 0 && (!bound || ctx.Done() == nil) {
		l.busy++
		l.mu.Unlock()
		unsent = sendOnce(ctx, l.c, cmd)
		l.mu.Lock()
		l.busy--
		l.startSender()
		l.mu.Unlock()
		return unsent, nil
	}
	q := queuedPool.Get().(*queued)
	q.ctx, q.cmd, q.token, q.fast = ctx, cmd, token, fast
	l.queue = append(l.queue, q)
	l.startSender()
	l.mu.Unlock()
	select {
	case <-q.done:
		return reuse(q), nil
	case <-ctx.Done():
	}
	l.mu.Lock()
	switch {
	case q.answered: // at the same time as ctx's end
		l.mu.Unlock()
		<-q.done
		return reuse(q), nil
	case q.taken: // q is the batch's now, and is not reused
		q.left = true
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
		return false, ctx.Err()
	}
	for i, o := range l.queue {
		if o == q {
			l.queue = append(l.queue[:i], l.queue[i+1:]...)
			break
		}
	}
	l.mu.Unlock()
	return true, ctx.Err()
}

// reuse returns q's outcome and puts q back in queuedPool.
func reuse(q *queued) (unsent bool) {
	unsent = q.unsent
	*q = queued{done: q.done}
	queuedPool.Put(q)
	return unsent
}

// after waits until no claim of owner token is on its way whose caller
// left it (send), or until ctx ends. A release that undoes such a claim
// then comes after it, and finds what it undoes: a claim still on its way
// on a connection that is being set up, say, could otherwise be applied
// after the release that was meant to undo it.
func (l *lane) after(ctx context.Context, token string) error {
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
		return fmt.Errorf("redislock: the claim of this owner token is still on its way: %w", ctx.Err())
	}
}

// startSender sets a sender to work on the queue, when there is one and
// fewer than maxSenders are at work. l.mu is held.
func (l *lane) startSender() {
	if len(l.queue) == 0 || l.busy >= maxSenders {
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
func (l *lane) sender() {
	var batch []*queued
	var idle *time.Timer
	for {
		l.mu.Lock()
		batch, l.queue = l.queue, batch[:0]
		if len(batch) > 0 {
			for _, q := range batch {
				q.taken = true
			}
			l.mu.Unlock()
			l.sendBatch(batch)
			l.mu.Lock()
			for _, q := range batch {
				q.answered = true
				if lc := l.pending[q.token]; q.left && lc != nil {
					if lc.n--; lc.n == 0 {
						delete(l.pending, q.token)
						l.npending.Add(-1)
						close(lc.done)
					}
				}
			}
			l.mu.Unlock()
			for i, q := range batch {
				if !q.left {
					q.done <- struct{}{}
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

// close makes idle senders exit, and busy ones when their queue is empty.
func (l *lane) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.stopped {
		l.stopped = true
		close(l.stop)
	}
}

// sendBatch sends the calls of batch, as sendOnce sends a command: as one
// command when there is one, else in one pipeline (which a Cluster client
// splits into one pipeline per node). On one server, the common claims and
// releases of a batch (fastCall) go in one script call (batch.lua), and
// those it leaves to their own scripts follow in a second round trip. A
// call whose caller has left is not sent again.
func (l *lane) sendBatch(batch []*queued) {
	ctx, cancel := batchContext(batch)
	defer cancel()
	var fast, rest []*queued
	if l.combine {
		for _, q := range batch {
			if q.fast.kind != 0 {
				fast = append(fast, q)
			} else {
				rest = append(rest, q)
			}
		}
	}
	if len(fast) < 2 {
		fast, rest = nil, batch
	}
	var combined *redis.Cmd
	if fast != nil {
		combined = combine(ctx, "evalsha", batchScript.sha, fast)
	}
	l.process(ctx, combined, rest, true)
	if combined != nil && isNoScript(combined.Err()) { // it ran nothing
		combined = combine(ctx, "eval", batchScript.src, fast)
		l.process(ctx, combined, nil, true)
	}
	var again, alone []*queued
	classify := func(qs []*queued) {
		for _, q := range qs {
			switch firstAttempt(q.ctx, q.cmd.Err(), l.retries) {
			case attemptUnsent:
				q.unsent = true
			case attemptAgain:
				again = append(again, q)
			}
		}
	}
	classify(rest)
	if combined != nil {
		replies, err := combined.Slice()
		switch {
		case err == nil && len(replies) == len(fast):
			for i, q := range fast {
				if replies[i] == nil {
					alone = append(alone, q) // left to its own script
				} else {
					q.cmd.(*redis.Cmd).SetVal(replies[i])
				}
			}
		case err == nil || !neverSent(err) && !retriedByDriver(err):
			alone = fast // not a reply of batch.lua's: each on its own
		default:
			for _, q := range fast {
				q.cmd.(*redis.Cmd).SetErr(err)
			}
			classify(fast)
		}
	}
	if len(alone) > 0 {
		l.process(ctx, nil, alone, true)
		classify(alone)
	}
	if len(again) > 0 {
		l.process(ctx, nil, again, false)
	}
}

// combine returns the script call (EVALSHA or EVAL, name, of payload) of
// batch.lua for the fastCalls of the calls in fast.
func combine(ctx context.Context, name, payload string, fast []*queued) *redis.Cmd {
	kinds := make([]byte, len(fast))
	args := make([]any, 0, 4+3*len(fast))
	args = append(args, name, payload, 2*len(fast))
	for _, q := range fast {
		args = append(args, q.fast.lock, q.fast.queue)
	}
	args = append(args, "")
	for i, q := range fast {
		kinds[i] = q.fast.kind
		args = append(args, q.fast.a, q.fast.b, q.fast.c)
	}
	args[3+2*len(fast)] = string(kinds)
	cmd := redis.NewCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

// process sends first (when not nil) and the calls of batch in one round
// trip: in one attempt when once is set, else with go-redis's retries.
func (l *lane) process(ctx context.Context, first *redis.Cmd, batch []*queued, once bool) {
	wrap := func(cmd redis.Cmder) redis.Cmder {
		if once {
			return noRetry{cmd}
		}
		return cmd
	}
	switch {
	case first == nil && len(batch) == 1:
		_ = l.c.Process(ctx, wrap(batch[0].cmd))
		return
	case first != nil && len(batch) == 0:
		_ = l.c.Process(ctx, wrap(first))
		return
	}
	pipe := l.c.Pipeline()
	if first != nil {
		_ = pipe.Process(ctx, wrap(first))
	}
	for _, q := range batch {
		_ = pipe.Process(ctx, wrap(q.cmd))
	}
	_, _ = pipe.Exec(ctx) // outcomes are read per command
}

// batchContext is the context a batch is sent with: not cancelled with
// any one caller's, and ending at the latest deadline of theirs (none when
// one of them has none), so that no caller's call is cut short by
// another's; a batch of one call is sent with its caller's ctx.
func batchContext(batch []*queued) (context.Context, context.CancelFunc) {
	if len(batch) == 1 { // its caller's own: it is nobody else's call
		return batch[0].ctx, func() {}
	}
	var last time.Time
	for _, q := range batch {
		d, ok := q.ctx.Deadline()
		if !ok {
			return context.WithoutCancel(batch[0].ctx), func() {}
		}
		if d.After(last) {
			last = d
		}
	}
	return context.WithDeadline(context.WithoutCancel(batch[0].ctx), last)
}
