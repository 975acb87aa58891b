package pg

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The lease operations on permits: claim, release (or keep) and renewal,
// each one batch sent in one round trip (statements in semaphore_sql.go).

// tryAcquirePermit is TryAcquire for req.Limit > 1, checked by TryAcquire,
// which was called at start (expireAt: req.ExpireAt, or nil): the header
// lock and the claim, which carries the claim bound, in one batch (one
// round trip, one transaction).
func (b *Backend) tryAcquirePermit(ctx context.Context, req core.AcquireRequest, start time.Time, expireAt any) (core.Lease, error) {
	if err := b.semUsable(ctx); err != nil {
		return core.Lease{}, err
	}
	conn, left, err := b.claimConn(ctx, start) // pg.go
	if err != nil {
		return core.Lease{}, err
	}
	defer conn.Release()
	mark := semMarkOf(req.Limit)
	batch := &pgx.Batch{}
	if b.cfg.legacy { // no queue
		batch.Queue(b.sem.stmt.acquireLock, req.Key, mark, req.Limit, req.OwnerToken, micro(req.TTL), expireAt)
		batch.Queue(b.sem.stmt.acquire, req.Key, mark, req.Limit, req.OwnerToken, micro(req.TTL), expireAt, req.Owner, micro(left))
	} else {
		batch.Queue(b.sem.stmt.acquireLock, req.Key, mark, req.Limit, req.OwnerToken, micro(req.TTL), expireAt, req.Waiter, micro(req.WaiterTTL))
		batch.Queue(b.sem.stmt.acquire, req.Key, mark, req.Limit, req.OwnerToken, micro(req.TTL), expireAt, req.Owner, req.Waiter, micro(req.WaiterTTL), b.notifyChannel(), micro(left))
	}
	br := conn.SendBatch(ctx, batch)
	lease, err := b.readPermitAcquire(br, req)
	if cerr := br.Close(); err == nil && cerr != nil {
		return core.Lease{}, b.claimErr(cerr, b.semErr)
	}
	return lease, err
}

func (b *Backend) readPermitAcquire(br pgx.BatchResults, req core.AcquireRequest) (core.Lease, error) {
	if _, err := br.Exec(); err != nil {
		return core.Lease{}, b.semErr(err)
	}
	rows, err := br.Query()
	if err != nil {
		return core.Lease{}, b.claimErr(err, b.semErr)
	}
	defer rows.Close()
	type answer struct {
		found    bool
		owner    string
		token    int64
		acquired pgtype.Timestamptz
		expires  time.Time
		left     int64
	}
	var ans [4]answer
	for rows.Next() {
		var kind int32
		var a answer
		if err := rows.Scan(&kind, &a.owner, &a.token, &a.acquired, &a.expires, &a.left); err != nil {
			return core.Lease{}, err
		}
		if kind >= 0 && int(kind) < len(ans) {
			a.found = true
			ans[kind] = a
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return core.Lease{}, b.claimErr(err, b.semErr)
	}
	switch {
	case ans[0].found:
		return core.Lease{Token: uint64(ans[0].token), AcquiredAt: ans[0].acquired.Time, ExpiresAt: ans[0].expires}, nil
	case ans[1].found:
		return core.Lease{Token: uint64(ans[1].token), AcquiredAt: ans[1].acquired.Time, ExpiresAt: ans[1].expires}, nil
	case ans[2].found:
		// ans[2].owner is the holder column: a header's mark, or a
		// mutex's owner token.
		return core.Lease{}, core.LimitMismatch(req.Key, max(semLimit(ans[2].owner), 1), req.Limit)
	case ans[3].found:
		a := ans[3]
		return core.Lease{}, core.Busy(req.Key, &core.Info{
			Key: req.Key, Owner: a.owner, Token: uint64(a.token), AcquiredAt: a.acquired.Time,
			ExpiresAt: a.expires, Remaining: time.Duration(a.left) * time.Microsecond, Limit: req.Limit,
		})
	}
	return core.Lease{}, core.Busy(req.Key, nil)
}

// releasePermit is Release for req.Limit > 1: the header lock and the
// delete (or, with Keep, the update) in one batch. A permit that was not
// live is answered core.Gone.
func (b *Backend) releasePermit(ctx context.Context, req core.ReleaseRequest) error {
	if b.sem.reason != nil {
		return nil // no permit can have been claimed
	}
	if ready, err := b.semPermitsReady(ctx); err != nil || !ready {
		return err // no permits table, no permit to release (the undo of a refused claim)
	}
	batch := &pgx.Batch{}
	batch.Queue(b.sem.stmt.releaseLock, req.Key, req.OwnerToken)
	if req.Keep > 0 {
		batch.Queue(b.sem.stmt.keep, req.Key, req.OwnerToken, micro(req.Keep))
	} else {
		batch.Queue(b.sem.stmt.release, req.Key, req.OwnerToken, b.notifyChannel())
	}
	br := b.pool.SendBatch(ctx, batch)
	live, err := permitReleased(br, req.Keep > 0)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return b.semErr(err)
	}
	b.prune(ctx)
	return released(req.Key, live)
}

// permitReleased reads releasePermit's batch: whether a live permit was
// released (or, with keep, kept).
func permitReleased(br pgx.BatchResults, keep bool) (bool, error) {
	if _, err := br.Exec(); err != nil { // the header lock
		return false, err
	}
	if keep {
		tag, err := br.Exec()
		return tag.RowsAffected() > 0, err
	}
	var live bool
	var n int64
	err := br.QueryRow().Scan(&live, &n)
	return live, err
}

// hasPermits reports whether a renewal includes permits.
func hasPermits(reqs []core.RenewRequest) bool {
	for _, r := range reqs {
		if r.Limit > 1 {
			return true
		}
	}
	return false
}

// renewWithPermits is Renew for a batch that includes permits: the header
// locks of the permits' keys, the mutex renewal (when there are mutexes)
// and the permits' renewal, in one batch: one round trip, one transaction.
func (b *Backend) renewWithPermits(ctx context.Context, reqs []core.RenewRequest) ([]error, error) {
	if b.sem.reason != nil {
		return nil, fmt.Errorf("pg: renew: %w", b.sem.reason)
	}
	var mk, mh, pk, ph, pm []string
	var mt, pt []int64
	for _, r := range reqs {
		if r.Limit > 1 {
			pk, ph, pt, pm = append(pk, r.Key), append(ph, r.OwnerToken), append(pt, micro(r.TTL)), append(pm, semMarkOf(r.Limit))
		} else {
			mk, mh, mt = append(mk, r.Key), append(mh, r.OwnerToken), append(mt, micro(r.TTL))
		}
	}
	lockKeys := append([]string(nil), pk...)
	slices.Sort(lockKeys)
	lockKeys = slices.Compact(lockKeys)
	batch := &pgx.Batch{}
	batch.Queue(b.sem.stmt.renewLock, lockKeys)
	if len(mk) > 0 {
		batch.Queue(b.stmt.renew, mk, mh, mt)
	}
	batch.Queue(b.sem.stmt.renew, pk, ph, pt, pm)
	br := b.pool.SendBatch(ctx, batch)
	type kh struct{ key, holder string }
	mutexes := make(map[kh]bool, len(mk))
	permits := make(map[kh]bool, len(pk))
	err := func() error {
		if _, err := br.Exec(); err != nil {
			return err
		}
		read := func(into map[kh]bool) error {
			rows, err := br.Query()
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var k kh
				if err := rows.Scan(&k.key, &k.holder); err != nil {
					return err
				}
				into[k] = true
			}
			return rows.Err()
		}
		if len(mk) > 0 {
			if err := read(mutexes); err != nil {
				return err
			}
		}
		return read(permits)
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("pg: renew: %w", b.semErr(err))
	}
	results := make([]error, len(reqs))
	for i, r := range reqs {
		renewed := mutexes
		if r.Limit > 1 {
			renewed = permits
		}
		if !renewed[kh{r.Key, r.OwnerToken}] {
			results[i] = core.Gone(r.Key, "held by another owner, expired or deleted")
		}
	}
	return results, nil
}
