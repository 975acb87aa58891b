package redislock

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"strings"

	"github.com/redis/go-redis/v9"
)

var (
	// The prelude comes first in every script: the lock record's format
	// and the waiter queue's functions.
	//go:embed record.lua
	recordLua string
	//go:embed queue.lua
	queueLua string
	prelude  = recordLua + "\n" + queueLua + "\n"

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

	acquireScript      = newScript(acquireLua)
	renewScript        = newScript(renewLua)
	releaseScript      = newScript(releaseLua)
	inspectScript      = newScript(inspectLua)
	forceReleaseScript = newScript(forceReleaseLua)
	leaveScript        = newScript(leaveLua)
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
