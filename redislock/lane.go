package redislock

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	shared "github.com/dislock/dislock/internal/lane"
)

// lane sends the claims, the releases and the clock reads of one Backend
// through a shared lane (internal/lane): calls that meet share round
// trips. A batch is one pipeline: one write and one read for the batch,
// on both sides of the connection, where a busy client and server spend
// most of their time on a request's and a reply's system calls.
//
// A call whose caller must get its answer back by ctx's end (a claim or a
// clock read: go-redis cuts a call at its read timeout, and at ctx's
// deadline only with ContextTimeoutEnabled, never at a cancel) always goes
// through a sender, and its caller waits for the reply or for ctx,
// whichever comes first; the engine then makes claims on the caller's
// goroutine (core.ContextBound). Any other call made while the lane is idle
// (a release) is sent at once on its caller's goroutine, so a lone caller
// pays nothing for the lane.
//
// A batch is sent as sendOnce sends a command: its first attempt alone, a
// call that could not get a connection reported as never sent, and a call
// that failed in a way go-redis would retry sent again with go-redis's
// retries. A caller whose ctx ends while its call waits in the queue takes
// it out: it was never sent. Once taken into a batch, the call is sent; a
// caller whose ctx ends meanwhile returns at once without its reply, and a
// release by the owner token of a claim left so waits for the claim's
// answer (after).
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
	calls   *shared.Lane[laneCall]
}

// laneCall is a call in a lane, and its outcome (in cmd, and unsent).
type laneCall struct {
	cmd    redis.Cmder
	fast   fastCall // the call as batch.lua takes it (kind 0: none)
	unsent bool
}

// queued is a call in a batch.
type queued = shared.Call[laneCall]

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

func newLane(c redis.UniversalClient) *lane {
	l := &lane{c: c}
	l.batch, l.retries = retryPolicy(c)
	l.calls = shared.New(func(ctx context.Context, v *laneCall) { v.unsent = sendOnce(ctx, l.c, v.cmd) }, l.sendBatch)
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
	q := l.calls.Get()
	q.V.cmd, q.V.fast = cmd, fast
	if err := l.calls.Do(ctx, q, token, !bound || ctx.Done() == nil); err != nil {
		if errors.Is(err, shared.ErrUnsent) {
			l.calls.Put(q)
			return true, ctx.Err()
		}
		return false, ctx.Err()
	}
	unsent = q.V.unsent
	l.calls.Put(q)
	return unsent, nil
}

// after waits until no claim of owner token is on its way whose caller
// left it (send), or until ctx ends: see shared.Lane.After.
func (l *lane) after(ctx context.Context, token string) error {
	if err := l.calls.After(ctx, token); err != nil {
		return fmt.Errorf("redislock: %w", err)
	}
	return nil
}

// close makes idle senders exit, and busy ones when their queue is empty.
func (l *lane) close() { l.calls.Close() }

// sendBatch sends the calls of batch, as sendOnce sends a command: as one
// command when there is one, else in one pipeline (which a Cluster client
// splits into one pipeline per node). On one server, the common claims and
// releases of a batch (fastCall) go in one script call (batch.lua), and
// those it leaves to their own scripts follow in a second round trip. A
// call whose caller has left is not sent again.
func (l *lane) sendBatch(ctx context.Context, batch []*queued) {
	var fast, rest []*queued
	if l.combine {
		for _, q := range batch {
			if q.V.fast.kind != 0 {
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
			switch firstAttempt(q.Ctx(), q.V.cmd.Err(), l.retries) {
			case attemptUnsent:
				q.V.unsent = true
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
					q.V.cmd.(*redis.Cmd).SetVal(replies[i])
				}
			}
		case err == nil || !neverSent(err) && !retriedByDriver(err):
			alone = fast // not a reply of batch.lua's: each on its own
		default:
			for _, q := range fast {
				q.V.cmd.(*redis.Cmd).SetErr(err)
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
		args = append(args, q.V.fast.lock, q.V.fast.queue)
	}
	args = append(args, "")
	for i, q := range fast {
		kinds[i] = q.V.fast.kind
		args = append(args, q.V.fast.a, q.V.fast.b, q.V.fast.c)
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
		_ = l.c.Process(ctx, wrap(batch[0].V.cmd))
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
		_ = pipe.Process(ctx, wrap(q.V.cmd))
	}
	_, _ = pipe.Exec(ctx) // outcomes are read per command
}
