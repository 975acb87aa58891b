package mysqllock

import (
	"context"
	"time"
)

// ProcNames are the suffixes of the procedures Migrate installs.
var ProcNames = procNames

// WithWatchPoll sets how long a watcher's wait lasts when nothing
// interrupts it.
func WithWatchPoll(d time.Duration) Option {
	return func(c *config) { c.watchPoll = d }
}

// WatchCalls is how many CALLs of watch b's watchers made.
func WatchCalls(b *Backend) int64 { return b.watchCalls.Load() }

// WithWatchLife sets how long a CALL of watch runs.
func WithWatchLife(d time.Duration) Option {
	return func(c *config) { c.watchLife = d }
}

// ClaimWaiters returns how many tries of key wait for the claim of key
// that b has on its way.
func ClaimWaiters(b *Backend, key string) int { return b.claims.Waiting(key) }

// ClaimOnItsWay reports whether b has a plain try's claim of key on its
// way.
func ClaimOnItsWay(b *Backend, key string) bool { return b.claims.OnItsWay(key) }

// LaneBatches is how many CALLs of the batch procedure b's lane made.
func LaneBatches(b *Backend) int64 { return b.batches.Load() }

// CallBatch calls b's batch procedure with items, its JSON argument, and
// the claims' bound half, and returns its answer.
func CallBatch(ctx context.Context, b *Backend, items string, half time.Duration) (string, error) {
	var out string
	err := b.batch.QueryRowContext(ctx, items, micro(half)).Scan(&out)
	return out, err
}
