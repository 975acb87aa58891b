package redislock

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dislock/dislock/core"
)

// Semaphores (core.Limit(n) with n > 1). A semaphore on key k lives in the
// sorted set at the lock's own Redis key (owner token -> permit expiry in
// Unix ms) and the hash "<lock key>:sem" (the limit, the last fencing
// token, and each permit's token, acquired-at and owner); its waiters are
// in the lock's queue. See sem_common.lua. A lock record is never a sorted
// set, so each kind detects the other by type and answers
// core.LimitMismatch; the scripts of locks fail with WRONGTYPE on a
// semaphore's key, and the Backend then runs the semaphore's.

var _ core.SemaphoreBackend = (*Backend)(nil)

const semSuffix = ":sem"

// legacyFenceSuffix names the fencing counter of the earlier lock layout (a
// hash per lock): a permit claim of a key with no record counts on from it.
const legacyFenceSuffix = ":fence"

// semKeys returns the permit set, the permit hash, the waiter queue and
// the waiters' deadlines of key.
func (b *Backend) semKeys(key string) []string {
	set := b.lockKey(key)
	return []string{set, set + semSuffix, set + queueSuffix, set + deadlinesSuffix}
}

// isWrongType reports whether err is Redis's answer to a command on a key
// of another type: a mutex script run on a semaphore's key.
func isWrongType(err error) bool {
	return err != nil && strings.Contains(err.Error(), "WRONGTYPE")
}

// semAcquire is TryAcquire for req.Limit > 1: one round trip.
func (b *Backend) semAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	if req.Limit > core.MaxLimit {
		return core.Lease{}, fmt.Errorf("%w: Limit: must be at most %d, got %d", core.ErrInvalidOption, core.MaxLimit, req.Limit)
	}
	var expireAt int64
	if !req.ExpireAt.IsZero() {
		expireAt = max(req.ExpireAt.UnixMilli(), 1)
	}
	ttl := max(req.TTL.Milliseconds(), 1)
	waiterTTL := max(req.WaiterTTL.Milliseconds(), 1)
	keys := append(b.semKeys(req.Key), b.lockKey(req.Key)+legacyFenceSuffix)
	vals, err := semAcquireScript.claim(ctx, b.lane, req.OwnerToken, fastCall{}, keys, req.OwnerToken, req.Owner,
		ttl, expireAt, req.Waiter, waiterTTL, req.Limit, b.channel, req.Key).Slice()
	if err != nil {
		return core.Lease{}, err
	}
	if len(vals) >= 1 {
		switch code, _ := toInt(vals[0]); {
		case (code == 2 || code == 4) && len(vals) == 1:
			// The slot is over, or a permit is free but it is other
			// waiters' turn.
			return core.Lease{}, core.Busy(req.Key, nil)
		case code == 3 && len(vals) == 2:
			have, err := toInt(vals[1])
			if err != nil {
				return core.Lease{}, fmt.Errorf("unexpected script reply %v", vals)
			}
			return core.Lease{}, core.LimitMismatch(req.Key, int(have), req.Limit)
		}
	}
	r, err := parseHolder(vals)
	if err != nil {
		return core.Lease{}, err
	}
	if !r.mine {
		info := r.info(req.Key)
		info.Limit = req.Limit
		return core.Lease{}, core.Busy(req.Key, &info)
	}
	lease := core.Lease{Token: r.token, AcquiredAt: r.acquired}
	switch {
	case r.pttl >= 0:
		lease.ExpiresAt = r.now.Add(time.Duration(r.pttl) * time.Millisecond)
	case expireAt > 0:
		lease.ExpiresAt = time.UnixMilli(expireAt)
	default:
		lease.ExpiresAt = r.now.Add(time.Duration(ttl) * time.Millisecond)
	}
	return lease, nil
}

// heldAsSemaphore answers a mutex claim (req) that found another type than
// a mutex record at the lock key: LimitMismatch when a semaphore holds it;
// when only expired permits were left (the read dropped them) the claim is
// made again, once.
func (b *Backend) heldAsSemaphore(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	hs, limit, err := b.semHolders(ctx, req.Key)
	switch {
	case err != nil:
		return core.Lease{}, err
	case limit > 1 && len(hs) > 0:
		return core.Lease{}, core.LimitMismatch(req.Key, limit, 1)
	case limit == 0 && ctx.Value(reclaimKey{}) == nil:
		return b.TryAcquire(context.WithValue(ctx, reclaimKey{}, true), req)
	}
	return core.Lease{}, fmt.Errorf("redislock: the Redis key of %q holds a value of another type than a lock", req.Key)
}

// reclaimKey marks the context of a claim made again by heldAsSemaphore.
type reclaimKey struct{}

// semRenewKeys returns the keys the permit renew script takes for r.
func (b *Backend) semRenewKeys(r core.RenewRequest) []string {
	return b.semKeys(r.Key)[:2]
}

// renewApart renews the mutex leases reqs[idx] one script call each, in one
// pipeline, after their batch failed because one of their keys now holds a
// semaphore: that lease is gone, the others are renewed as usual.
func (b *Backend) renewApart(ctx context.Context, reqs []core.RenewRequest, idx []int, results []error) {
	if len(idx) == 1 {
		results[idx[0]] = core.Gone(reqs[idx[0]].Key, "the key holds a semaphore")
		return
	}
	calls := make([]*call, len(idx))
	for j, i := range idx {
		calls[j] = &call{s: renewScript, keys: []string{b.lockKey(reqs[i].Key)},
			args: []any{reqs[i].OwnerToken, max(reqs[i].TTL.Milliseconds(), 1)}}
	}
	runBatch(ctx, b.client, calls)
	for j, i := range idx {
		vals, err := calls[j].cmd.Slice()
		switch {
		case isWrongType(err):
			results[i] = core.Gone(reqs[i].Key, "the key holds a semaphore")
		case err != nil:
			results[i] = fmt.Errorf("redislock: renew: %w", err)
		case len(vals) == 1:
			if n, _ := toInt(vals[0]); n != 1 {
				results[i] = core.Gone(reqs[i].Key, "held by another owner or gone")
			}
		default:
			results[i] = fmt.Errorf("redislock: renew: unexpected script reply %v", vals)
		}
	}
}

// semRelease is Release for a permit: one round trip.
func (b *Backend) semRelease(ctx context.Context, req core.ReleaseRequest) error {
	var keep int64
	if req.Keep > 0 {
		keep = max(req.Keep.Milliseconds(), 1)
	}
	if err := b.lane.after(ctx, req.OwnerToken); err != nil {
		return err
	}
	n, err := semReleaseScript.run(ctx, b.client, b.semKeys(req.Key),
		req.OwnerToken, keep, b.channel, req.Key).Int()
	return releaseResult(req.Key, n, err)
}

// Holders implements core.SemaphoreBackend: every live permit of key's
// semaphore, oldest (smallest token) first, each with Info.Limit set; the
// one holder of a mutex; nothing when the key is free. Expired permits are
// dropped as the key is read.
func (b *Backend) Holders(ctx context.Context, key string) ([]core.Info, error) {
	if err := core.ValidateKey(key); err != nil {
		return nil, err
	}
	hs, limit, err := b.semHolders(ctx, key)
	if err != nil {
		return nil, err
	}
	if limit != 1 {
		return hs, nil
	}
	info, ok, err := b.Inspect(ctx, key)
	if err != nil || !ok {
		return nil, err
	}
	return []core.Info{info}, nil
}

// semHolders reads key's permits. limit is the semaphore's, 0 when the key
// is free, and 1 when it holds a mutex (then hs is empty).
func (b *Backend) semHolders(ctx context.Context, key string) (hs []core.Info, limit int, err error) {
	c := b.semHoldersCall(key)
	runBatch(ctx, b.client, []*call{c})
	hs, limit, err = parseSemHolders(key, c.cmd)
	if err != nil {
		return nil, 0, fmt.Errorf("redislock: holders: %w", err)
	}
	return hs, limit, nil
}

func (b *Backend) semHoldersCall(key string) *call {
	return &call{s: semHoldersScript, keys: b.semKeys(key)[:3]}
}

// parseSemHolders reads {1, limit, time_s, time_us, expiry_ms, entry, ...},
// {0} (free) or {-1} (another type: limit 1).
func parseSemHolders(key string, cmd *redis.Cmd) ([]core.Info, int, error) {
	v, err := cmd.Slice()
	if err != nil {
		return nil, 0, err
	}
	code, err := toInt(first(v))
	if err != nil {
		return nil, 0, fmt.Errorf("unexpected script reply: %w", err)
	}
	switch {
	case code == 0 && len(v) == 1:
		return nil, 0, nil
	case code == -1 && len(v) == 1:
		return nil, 1, nil
	case code != 1 || len(v) < 4 || len(v)%2 != 0:
		return nil, 0, fmt.Errorf("unexpected script reply of %d items", len(v))
	}
	limit, err1 := toInt(v[1])
	sec, err2 := toInt(v[2])
	usec, err3 := toInt(v[3])
	if err1 != nil || err2 != nil || err3 != nil {
		return nil, 0, fmt.Errorf("unexpected script reply %v", v[:4])
	}
	now := time.Unix(sec, usec*1000)
	hs := make([]core.Info, 0, (len(v)-4)/2)
	for i := 4; i < len(v); i += 2 {
		exp, _ := v[i].(string)
		ms, err := strconv.ParseFloat(exp, 64)
		if err != nil {
			return nil, 0, fmt.Errorf("unexpected permit expiry %q", exp)
		}
		entry, _ := v[i+1].(string)
		info := core.Info{Key: key, Limit: int(limit), ExpiresAt: time.UnixMilli(int64(ms))}
		info.Remaining = max(info.ExpiresAt.Sub(now), 0)
		tok, rest, _ := strings.Cut(entry, " ")
		acq, owner, _ := strings.Cut(rest, " ")
		info.Owner = owner
		info.Token, _ = strconv.ParseUint(tok, 10, 64)
		if us, _ := strconv.ParseInt(acq, 10, 64); us > 0 {
			info.AcquiredAt = time.UnixMicro(us)
		}
		hs = append(hs, info)
	}
	slices.SortFunc(hs, func(a, b core.Info) int {
		switch {
		case a.Token < b.Token:
			return -1
		case a.Token > b.Token:
			return 1
		}
		return 0
	})
	return hs, int(limit), nil
}

func first(v []any) any {
	if len(v) == 0 {
		return nil
	}
	return v[0]
}

// semInspect is Inspect of a key that holds a semaphore: its oldest permit.
func (b *Backend) semInspect(ctx context.Context, key string) (core.Info, bool, error) {
	hs, _, err := b.semHolders(ctx, key)
	if err != nil || len(hs) == 0 {
		return core.Info{}, false, err
	}
	return hs[0], true, nil
}

// semList reads the permits of keys (keys that List found holding another
// type than a mutex), in pipelines of up to 512 keys.
func (b *Backend) semList(ctx context.Context, keys []string) ([]core.Info, error) {
	var list []core.Info
	for start := 0; start < len(keys); start += 512 {
		part := keys[start:min(start+512, len(keys))]
		calls := make([]*call, len(part))
		for i, k := range part {
			calls[i] = b.semHoldersCall(k)
		}
		runBatch(ctx, b.client, calls)
		for i, c := range calls {
			hs, _, err := parseSemHolders(part[i], c.cmd)
			if err != nil {
				return nil, err
			}
			list = append(list, hs...)
		}
	}
	return list, nil
}

// semForceRelease is ForceRelease of a key that holds a semaphore: every
// permit goes, and the first live waiter is told its turn.
func (b *Backend) semForceRelease(ctx context.Context, key string) (int, error) {
	return semForceReleaseScript.run(ctx, b.client, b.semKeys(key), b.channel, key).Int()
}

// semLeave is the end of Leave on a key that holds a semaphore: waiter is
// out of the queue, and the first live waiter is told its turn when a
// permit is free.
func (b *Backend) semLeave(ctx context.Context, key, waiter string) error {
	return semLeaveScript.run(ctx, b.client, b.semKeys(key), waiter, b.channel, key).Err()
}
