package gocronlock

import (
	"context"
	"errors"

	"github.com/go-co-op/gocron/v2"

	"github.com/dislock/dislock/core"
)

// TaskFunc is a job body that runs under a lock: ctx carries the session
// (core.SessionFromContext) and is cancelled when the job's context is or
// when the session ends, with context.Cause matching core.ErrLeaseLost on a
// lost lease; s gives the fencing token.
type TaskFunc func(ctx context.Context, s core.Session) error

// Wrap returns a gocron task function that runs fn under the lock prefix +
// key. Each run makes one attempt bounded by TryTimeout; when the lock is
// busy the run returns an error matching core.ErrNotAcquired without calling
// fn (gocron records it as a failed run; tell it apart with errors.Is).
// After fn the lock is released on a detached, bounded context.
//
// By default the lock is a lease, renewed while fn runs; MinHold keeps it a
// little longer so a fast job runs once per tick. With Slot the lock is the
// tick's slot, and the session, hence ctx, ends when the slot does. With
// Limit(n), up to n runs hold the key at once, each on a permit of its own.
//
// The run returns fn's error; or, when the session ended (lease lost, slot
// over) while fn ran, an error matching core.ErrLeaseLost even if fn
// returned nil; or the release error, which matches core.ErrLeaseLost too
// when the release found the lease gone from the store (joined with fn's
// error when fn failed). Options are validated here.
func Wrap(l core.Locker, key string, fn TaskFunc, opts ...Option) (func(ctx context.Context) error, error) {
	cfg, err := resolveConfig(forTask, l, opts)
	if err != nil {
		return nil, err
	}
	if fn == nil {
		return nil, invalid("TaskFunc", "nil function")
	}
	key = cfg.prefix + key
	if err := core.ValidateKey(key); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		s, slot, err := cfg.try(ctx, l, key, nil, cfg.limit)
		if err != nil {
			return err
		}
		runCtx, stop := core.Bind(ctx, s)
		ferr := fn(runCtx, s)
		stop()
		var lost error
		if cause := s.Err(); cause != nil && errors.Is(cause, core.ErrLeaseLost) {
			lost = cause
		}
		rerr := cfg.release(ctx, s, slot)
		switch {
		case lost != nil && ferr != nil:
			return errors.Join(lost, ferr)
		case lost != nil:
			return lost
		case ferr != nil && errors.Is(rerr, core.ErrLeaseLost):
			// The release found the lease gone: fn's failure and the loss.
			return errors.Join(rerr, ferr)
		case ferr != nil:
			return ferr
		}
		return rerr
	}, nil
}

// NewTask is Wrap as a gocron.Task, for Scheduler.NewJob. gocron passes the
// job's context, which it cancels at shutdown.
func NewTask(l core.Locker, key string, fn TaskFunc, opts ...Option) (gocron.Task, error) {
	run, err := Wrap(l, key, fn, opts...)
	if err != nil {
		return nil, err
	}
	return gocron.NewTask(run), nil
}
