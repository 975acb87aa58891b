package pg

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// This file holds the parts of core.Queuer that are not in TryAcquire and
// Release: Leave and WatchTurns, and KeepsQueue (core.QueueKeeper). The
// queue lives in the lock row's waiters column (schema.go); the statements
// are in sql.go.

// KeepsQueue implements core.QueueKeeper: false on the legacy table, which
// has no column for a queue, so that the engine runs the Backend as a
// core.Watcher there (core.QueuerOf): it sends no Waiter and no Leave, and
// a release's notification, which every process gets, wakes one waiter of
// each process, a wake-up not used passing to the next.
func (b *Backend) KeepsQueue() bool { return b.stmt.queue }

// Leave implements core.Queuer: one statement takes waiter out of key's
// queue; when waiter was first in line and the key can be claimed (it is
// free, or a semaphore with a permit free), the next live waiter is
// notified in the same statement. On the legacy table, which has no queue
// (KeepsQueue), it does nothing.
func (b *Backend) Leave(ctx context.Context, key, waiter string) error {
	if !b.stmt.queue || waiter == "" {
		return nil
	}
	stmt := b.stmt.leave
	if b.sem.isReady() {
		// Only a process that found the permits table queues on a
		// semaphore; the statement reads it.
		stmt = b.sem.stmt.leave
	}
	if _, err := b.pool.Exec(ctx, stmt, key, waiter, b.notifyChannel()); err != nil {
		return fmt.Errorf("pg: leave: %w", poolerHint(err))
	}
	return nil
}

// WatchTurns implements core.Queuer: Watch, with the waiter whose turn it
// is. A release, ForceRelease, Leave or a semaphore grant that leaves a
// permit free notifies only when a live waiter is queued, naming the
// first; the legacy table's releases, and those of older versions of this
// package, name none (waiter "").
func (b *Backend) WatchTurns(ctx context.Context, ready func(), fn func(key, waiter string)) error {
	return b.watch(ctx, ready, func(payload string) {
		key, waiter := parseTurn(payload)
		fn(key, waiter)
	})
}

// parseTurn splits a notification's payload: "<n>:<waiter><key>" with n the
// waiter's length in bytes (see turnPayload), or a bare key (the legacy
// table, older versions).
func parseTurn(payload string) (key, waiter string) {
	i := strings.IndexByte(payload, ':')
	if i <= 0 || i > 4 {
		return payload, ""
	}
	n, err := strconv.Atoi(payload[:i])
	rest := payload[i+1:]
	if err != nil || n < 0 || n >= len(rest) || payload[0] == '+' || payload[0] == '-' {
		return payload, ""
	}
	return rest[n:], rest[:n]
}
