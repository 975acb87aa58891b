package pg

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/dislock/dislock/core"
	"github.com/jackc/pgx/v5"
)

// The Admin calls and Holders on semaphores: the live permits of a key or a
// prefix, and ForceRelease of every permit of a key.

// Holders implements core.SemaphoreBackend: every live permit of key,
// oldest first (Info.Limit set), or the holder of a mutex; empty when the
// key is free.
func (b *Backend) Holders(ctx context.Context, key string) ([]core.Info, error) {
	if err := core.ValidateKey(key); err != nil {
		return nil, err
	}
	ready, err := b.semPermitsReady(ctx)
	if err != nil {
		return nil, err
	}
	if ready {
		list, err := b.queryPermits(ctx, "holders", b.sem.stmt.holders, key)
		if err != nil {
			return nil, err
		}
		if len(list) > 0 {
			return list, nil
		}
	}
	info, ok, err := b.Inspect(ctx, key)
	if err != nil || !ok {
		return nil, err
	}
	return []core.Info{info}, nil
}

// inspectPermits is Inspect of a semaphore's key: its oldest live permit.
func (b *Backend) inspectPermits(ctx context.Context, key string) (core.Info, bool, error) {
	if ready, err := b.semPermitsReady(ctx); err != nil || !ready {
		return core.Info{}, false, err
	}
	list, err := b.queryPermits(ctx, "inspect", b.sem.stmt.holders, key)
	if err != nil || len(list) == 0 {
		return core.Info{}, false, err
	}
	return list[0], true, nil
}

// queryPermits runs stmt, a query of live permits, with arg (a key or a
// prefix) and returns them; op names the call in its error.
func (b *Backend) queryPermits(ctx context.Context, op, stmt, arg string) ([]core.Info, error) {
	rows, err := b.pool.Query(ctx, stmt, arg)
	if err == nil {
		var list []core.Info
		if list, err = scanInfos(rows, true); err == nil {
			return list, nil
		}
	}
	return nil, fmt.Errorf("pg: %s: %w", op, b.semErr(err))
}

// listPermits replaces the semaphores' header rows in list (the lock
// table's live rows whose key starts with prefix, by key) with one Info per
// live permit.
func (b *Backend) listPermits(ctx context.Context, prefix string, list []core.Info) ([]core.Info, error) {
	out := list[:0]
	headers := 0
	for _, info := range list {
		if semLimit(info.Owner) > 0 {
			headers++
			continue
		}
		out = append(out, info)
	}
	if headers == 0 {
		return out, nil
	}
	if ready, err := b.semPermitsReady(ctx); err != nil || !ready {
		return out, err
	}
	permits, err := b.queryPermits(ctx, "list", b.sem.stmt.list, prefix)
	if err != nil {
		return nil, err
	}
	out = append(out, permits...)
	slices.SortStableFunc(out, func(a, b core.Info) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// forceReleasePermits is ForceRelease of a semaphore's key: every permit
// and the header, in one batch. handled is false when key is not a
// semaphore's (ForceRelease then deletes the lock table's row).
func (b *Backend) forceReleasePermits(ctx context.Context, key string) (handled, released bool, err error) {
	if ready, err := b.semPermitsReady(ctx); err != nil || !ready {
		return false, false, err
	}
	batch := &pgx.Batch{}
	batch.Queue(b.sem.stmt.forceLock, key)
	batch.Queue(b.sem.stmt.force, key, b.notifyChannel())
	br := b.pool.SendBatch(ctx, batch)
	err = func() error {
		if _, err := br.Exec(); err != nil {
			return err
		}
		var n int64
		return br.QueryRow().Scan(&handled, &released, &n)
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, false, fmt.Errorf("pg: force release: %w", b.semErr(err))
	}
	return handled, released, nil
}
