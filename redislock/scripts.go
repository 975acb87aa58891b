package redislock

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"net"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/dislock/dislock/core"
)

var (
	// The prelude comes first in every script: the lock record's format
	// and the waiter queue's functions.
	//go:embed record.lua
	recordLua string
	//go:embed queue.lua
	queueLua string
	prelude  = recordLua + "\n" + queueLua + "\n"

	// fast.lua comes before the scripts that take its common cases.
	//go:embed fast.lua
	fastLua string
	//go:embed acquire.lua
	acquireLua string
	//go:embed renew.lua
	renewLua string
	//go:embed release.lua
	releaseLua string
	//go:embed inspect.lua
	inspectLua string
	//go:embed forcerelease.lua
	forceReleaseLua string
	//go:embed leave.lua
	leaveLua string
	//go:embed batch.lua
	batchLua string

	acquireScript      = newScript(fastLua + acquireLua)
	renewScript        = newScript(renewLua)
	releaseScript      = newScript(fastLua + releaseLua)
	inspectScript      = newScript(inspectLua)
	forceReleaseScript = newScript(forceReleaseLua)
	leaveScript        = newScript(leaveLua)
	batchScript        = bareScript(fastLua + batchLua) // all fast.lua's: no prelude
)

// Semaphore scripts (semaphore.go): each is sem_common.lua followed by its
// own file.
var (
	//go:embed sem_common.lua
	semCommonLua string
	//go:embed sem_acquire.lua
	semAcquireLua string
	//go:embed sem_renew.lua
	semRenewLua string
	//go:embed sem_release.lua
	semReleaseLua string
	//go:embed sem_holders.lua
	semHoldersLua string
	//go:embed sem_forcerelease.lua
	semForceReleaseLua string
	//go:embed sem_leave.lua
	semLeaveLua string

	semAcquireScript = newScript(semCommonLua + semAcquireLua)
	semRenewScript   = newScript(semCommonLua + semRenewLua)
	semReleaseScript = newScript(semCommonLua + semReleaseLua)
	semHoldersScript = newScript(semCommonLua + semHoldersLua)

	semForceReleaseScript = newScript(semCommonLua + semForceReleaseLua)
	semLeaveScript        = newScript(semCommonLua + semLeaveLua)
)

// script is a Lua script run by SHA1 (EVALSHA), falling back to its source
// (EVAL, which also caches it on that server) when the server answers
// NOSCRIPT: after a restart, a failover or SCRIPT FLUSH, and on each Cluster
// node the first time.
type script struct {
	src, sha string
}

// preludeMark is the line of a script's source where the prelude goes; a
// script without it has the prelude first. The part before it is a fast
// path that uses none of the prelude's functions: defining them costs the
// server more than that path's own work, on every call.
const preludeMark = "--@prelude\n"

// newScript returns the script whose body is src, with the prelude at its
// mark, else first.
func newScript(src string) *script {
	if head, tail, ok := strings.Cut(src, preludeMark); ok {
		src = head + prelude + tail
	} else {
		src = prelude + src
	}
	return bareScript(src)
}

// bareScript returns the script whose body is src, without the prelude.
func bareScript(src string) *script {
	sum := sha1.Sum([]byte(src))
	return &script{src: src, sha: hex.EncodeToString(sum[:])}
}

// run runs s as one command.
func (s *script) run(ctx context.Context, c redis.Scripter, keys []string, args ...any) *redis.Cmd {
	cmd := c.EvalSha(ctx, s.sha, keys, args...)
	if isNoScript(cmd.Err()) {
		cmd = c.Eval(ctx, s.src, keys, args...)
	}
	return authCmd(cmd)
}

// claim runs s, a script that claims a lock or a permit, like run, but
// with each command's first attempt sent alone (sendOnce). When the claim
// failed before it reached the server, the error is marked core.Unclaimed,
// so that the engine neither waits for nor sends an undo against a server
// that refused the connection.
func (s *script) claim(ctx context.Context, l *lane, token string, fast fastCall, keys []string, args ...any) *redis.Cmd {
	cmd, unsent := s.send(ctx, l, keys, args, token, fast)
	if unsent {
		cmd.SetErr(core.Unclaimed(cmd.Err()))
	}
	return cmd
}

// send runs s through l (EVALSHA, then EVAL when the server does not know
// the script), each command sent as sendOnce sends it, and reports whether
// the call failed before it reached the server. A claim passes its owner
// token, and is bound to end with ctx (lane.send); any other call passes "".
// fast is the call as batch.lua takes it (kind 0: it cannot).
func (s *script) send(ctx context.Context, l *lane, keys []string, args []any, claim string, fast fastCall) (*redis.Cmd, bool) {
	bound := claim != ""
	cmd := evalCmd(ctx, "evalsha", s.sha, keys, args)
	unsent, err := l.send(ctx, cmd, bound, claim, fast)
	if err == nil && isNoScript(cmd.Err()) { // EVALSHA ran nothing
		cmd = evalCmd(ctx, "eval", s.src, keys, args)
		unsent, err = l.send(ctx, cmd, bound, claim, fastCall{})
	}
	if err != nil { // cmd is still on its way in a batch
		cmd = redis.NewCmd(ctx)
		cmd.SetErr(err)
	}
	if unsent {
		return cmd, true
	}
	return authCmd(cmd), false
}

// evalCmd is the command EVAL or EVALSHA (name) of payload, as go-redis's
// Eval and EvalSha build it, not yet processed.
func evalCmd(ctx context.Context, name, payload string, keys []string, args []any) *redis.Cmd {
	cmdArgs := make([]any, 0, 3+len(keys)+len(args))
	cmdArgs = append(cmdArgs, name, payload, len(keys))
	for _, k := range keys {
		cmdArgs = append(cmdArgs, k)
	}
	cmd := redis.NewCmd(ctx, append(cmdArgs, args...)...)
	if len(keys) > 0 {
		cmd.SetFirstKeyPos(3)
	}
	return cmd
}

// noRetry is a command that go-redis sends in one attempt.
type noRetry struct{ redis.Cmder }

// NoRetry implements redis.Cmder.
func (noRetry) NoRetry() bool { return true }

// sendOnce processes cmd on c and reports whether it failed before it
// reached the server. Left to itself, go-redis retries a command that
// could not get a connection MaxRetries times, each time dialling up to
// DialerRetries times: about 1.7 s against a refused port with the default
// options, and it cannot say afterwards whether an earlier attempt had
// written the command. So on the clients whose retry loops honour a
// command's NoRetry (*redis.Client, which Sentinel failover also is,
// *redis.ClusterClient and *redis.Ring) the first attempt goes out alone.
// When it failed to get a connection (the dial failed, the pool timed out
// or is closed), nothing was sent: that failure is returned at once, and
// sendOnce reports true. After any other failure go-redis would retry
// (a connection lost after the write, LOADING, READONLY, ...) cmd is
// processed again with go-redis's own retries, as a retry of the first
// attempt: every script of this package is idempotent per owner token.
// Other clients process cmd as it is, and sendOnce reports false.
func sendOnce(ctx context.Context, c redis.UniversalClient, cmd redis.Cmder) bool {
	known, retries := retryPolicy(c)
	if !known {
		_ = c.Process(ctx, cmd)
		return false
	}
	err := c.Process(ctx, noRetry{cmd})
	switch firstAttempt(ctx, err, retries) {
	case attemptUnsent:
		return true
	case attemptAgain:
		_ = c.Process(ctx, cmd)
	}
	return false
}

// retryPolicy reports whether c is a client whose retry loops honour a
// command's NoRetry (known), and whether it retries a failed command.
func retryPolicy(c redis.UniversalClient) (known, retries bool) {
	switch c := c.(type) {
	case *redis.Client:
		return true, c.Options().MaxRetries > 0
	case *redis.ClusterClient:
		return true, c.Options().MaxRetries > 0 || c.Options().MaxRedirects > 0
	case *redis.Ring:
		return true, c.Options().MaxRetries > 0
	}
	return false, false
}

// What a command's first attempt, sent without go-redis's retries, calls
// for (firstAttempt).
const (
	attemptDone   = iota // answered, or failed for good
	attemptUnsent        // it got no connection: nothing was sent
	attemptAgain         // send it again, with go-redis's retries
)

// firstAttempt classifies err, the outcome of a command's first attempt
// whose caller's ctx is ctx, on a client that retries (retries) or not.
func firstAttempt(ctx context.Context, err error, retries bool) int {
	switch {
	case err == nil:
		return attemptDone
	case neverSent(err):
		return attemptUnsent
	case retries && ctx.Err() == nil && retriedByDriver(err):
		return attemptAgain
	}
	return attemptDone
}

// neverSent reports whether err, the failure of one attempt of a command,
// came before the command was written: a connection could not be had.
func neverSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial" ||
		errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrPoolExhausted) || errors.Is(err, redis.ErrClosed)
}

// retriedByDriver reports whether go-redis retries a command that failed
// with err: after a transport failure (the connection was lost, a read
// timed out) unless ctx ended, and after the replies that say the server
// did not run it.
func retriedByDriver(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var reply redis.Error
	if !errors.As(err, &reply) {
		return true
	}
	return redis.IsLoadingError(err) || redis.IsReadOnlyError(err) || redis.IsMasterDownError(err) ||
		redis.IsClusterDownError(err) || redis.IsTryAgainError(err) || redis.IsNoReplicasError(err) ||
		redis.IsMaxClientsError(err)
}

// authRequired is a reply saying that the server wants a password the
// client did not send: NOAUTH, or the "Protocol error: unauthenticated
// multibulk length" a server with a password answers, before closing the
// connection, to a command with more arguments than it reads from a client
// that has not authenticated (every script call of dislock's).
type authRequired struct{ err error }

func (e authRequired) Error() string {
	return "authentication required: the server has a password and the client sent none (" + e.err.Error() + ")"
}

func (e authRequired) Unwrap() error { return e.err }

// authErr returns err, marked as authRequired when it says so.
func authErr(err error) error {
	if err == nil {
		return nil
	}
	if redis.HasErrorPrefix(err, "NOAUTH") || strings.Contains(err.Error(), "Protocol error: unauthenticated") {
		return authRequired{err}
	}
	return err
}

// authCmd marks cmd's error as authRequired when it says so.
func authCmd(cmd *redis.Cmd) *redis.Cmd {
	if err := cmd.Err(); err != nil {
		if a := authErr(err); a != err {
			cmd.SetErr(a)
		}
	}
	return cmd
}

func isNoScript(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}

// call is one script invocation in a batch.
type call struct {
	s    *script
	keys []string
	args []any
	cmd  *redis.Cmd
}

// runBatch runs calls in one pipeline (which a Cluster client splits into
// one pipeline per node, sent in parallel). go-redis does not fall back from
// EVALSHA to EVAL inside a pipeline, so the calls answered NOSCRIPT are sent
// again, by source, in a second pipeline. Each call's outcome is in its cmd.
func runBatch(ctx context.Context, c redis.UniversalClient, calls []*call) {
	switch len(calls) {
	case 0:
		return
	case 1:
		k := calls[0]
		k.cmd = k.s.run(ctx, c, k.keys, k.args...)
		return
	}
	pipe := c.Pipeline()
	for _, k := range calls {
		k.cmd = pipe.EvalSha(ctx, k.s.sha, k.keys, k.args...)
	}
	_, _ = pipe.Exec(ctx) // errors are read per command
	var retry []*call
	for _, k := range calls {
		if isNoScript(k.cmd.Err()) {
			retry = append(retry, k)
		} else {
			authCmd(k.cmd)
		}
	}
	if len(retry) == 0 {
		return
	}
	pipe = c.Pipeline()
	for _, k := range retry {
		k.cmd = pipe.Eval(ctx, k.s.src, k.keys, k.args...)
	}
	_, _ = pipe.Exec(ctx)
	for _, k := range retry {
		authCmd(k.cmd)
	}
}
