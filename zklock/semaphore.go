package zklock

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dislock/dislock/core"
)

var _ core.SemaphoreBackend = (*Backend)(nil)

// judgePermit decides, from the children of parent, whether the permit
// claim ours, created at server time now, holds one of limit permits: it
// does when fewer than limit permits are in force below it — permit
// claims with a lower sequence number and permit holds — all taken with
// the same limit, and no mutex claim below it or mutex hold is in force.
//
// This keeps at most limit holders: a claim's position only improves
// (claims created later get higher sequence numbers), and a claim below it
// stops counting only once it is gone (released, expired with its session,
// or deleted by an acquirer because its TTL ran out, guarded by the version
// it judged, so a renewal in between wins). So when the highest of the
// holders decided, every other holder was below it and counted.
//
// Nothing is read but the children when the claims below are all permits
// of the same limit and fewer than limit together with the permit holds:
// each counts as in force. Otherwise the claims below are read in order
// (setting a watch on each one in force, so that its release wakes this
// backend's waiters) until limit of them are in force: busy, with the
// permit that expires first.
//
// mine is the czxid of our claim when this attempt made it (0 otherwise):
// when the key node was written after it, another permit may have been
// granted since, and regrant says so.
func (b *Backend) judgePermit(ctx context.Context, key, parent string, ours child, now int64, limit int, mine int64) (verdict, error) {
	names, pst, err := b.childrenStat(ctx, parent)
	if err != nil {
		return verdict{}, err
	}
	regrant := pst != nil && mine > 0 && pst.Mzxid > mine
	sc := b.scanChildren(parent, names, ours, now)
	if !sc.found {
		return verdict{gone: true}, nil // deleted meanwhile (force release): not ours
	}
	lower := sc.lower
	var holds []child // the permits' holds
	mutexHold := false
	for _, h := range sc.holds {
		if h.limit == 0 {
			mutexHold = true
		} else {
			holds = append(holds, h)
		}
	}
	if mutexHold {
		return verdict{mismatch: 1}, nil
	}
	for _, h := range holds {
		if h.limit != limit {
			return verdict{mismatch: h.limit}, nil
		}
	}
	read := false // some claim below must be read to be judged
	for _, l := range lower {
		if l.limit != limit {
			read = true
		}
	}
	if !read && len(holds)+len(lower) < limit {
		return verdict{held: true, names: names, regrant: regrant}, nil
	}
	sort.Slice(lower, func(i, j int) bool { return lower[i].seq < lower[j].seq })
	var first *core.Info // in force, expires first
	for _, h := range holds {
		info := &core.Info{Key: key, ExpiresAt: msTime(h.until), Remaining: time.Duration(h.until-now) * time.Millisecond, Limit: h.limit}
		if first == nil || info.ExpiresAt.Before(first.ExpiresAt) {
			first = info
		}
	}
	count := len(holds)
	for _, l := range lower {
		if count >= limit {
			break
		}
		p := parent + "/" + l.name
		data, st, ch, err := b.getW(ctx, p)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return verdict{}, err
		}
		ttl, owner, perr := parseData(data)
		info := &core.Info{Key: key, Owner: owner, Token: ClaimToken(data, st), AcquiredAt: msTime(st.Ctime)}
		if l.limit > 1 {
			info.Limit = l.limit
		}
		if perr == nil {
			exp := st.Mtime + ttl
			info.ExpiresAt = msTime(exp)
			if exp <= now {
				// Not renewed within its TTL: delete exactly the version
				// judged; a renewal in between keeps it in force.
				derr := b.deleteVersion(ctx, p, st.Version)
				if derr == nil || errors.Is(derr, zk.ErrNoNode) {
					continue
				}
				if !errors.Is(derr, zk.ErrBadVersion) {
					return verdict{}, derr
				}
				info.ExpiresAt = msTime(now + ttl)
			}
			info.Remaining = info.ExpiresAt.Sub(msTime(now))
		}
		// In force.
		b.armWatch(p, key, ch)
		if l.limit != limit {
			return verdict{mismatch: max(l.limit, 1), info: info}, nil
		}
		count++
		if first == nil || (!info.ExpiresAt.IsZero() && info.ExpiresAt.Before(first.ExpiresAt)) {
			first = info
		}
	}
	if count < limit {
		return verdict{held: true, names: names, regrant: regrant}, nil
	}
	return verdict{info: first, names: names}, nil
}

// Holders implements core.SemaphoreBackend: the permits of key in force,
// oldest first (permit holds by their token), or its one mutex holder. It
// reads the key's children, each claim's node, and writes <root>/clock once
// for the server time.
func (b *Backend) Holders(ctx context.Context, key string) ([]core.Info, error) {
	if err := core.ValidateKey(key); err != nil {
		return nil, err
	}
	list, err := b.holders(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("zklock: holders: %w", err)
	}
	return list, nil
}

func (b *Backend) holders(ctx context.Context, key string) ([]core.Info, error) {
	parent := b.keyPath(key)
	names, err := b.children(ctx, parent, true)
	if err != nil || len(names) == 0 {
		return nil, err
	}
	now, err := b.Now(ctx, key)
	if err != nil {
		return nil, err
	}
	return b.holdersOf(ctx, key, parent, names, now.UnixMilli())
}

// hasPermits reports whether names include permit claims or holds.
func hasPermits(names []string) bool {
	for _, n := range names {
		if c, ok := parseChild(n); ok && c.limit > 1 {
			return true
		}
	}
	return false
}

// holdersOf lists the holders of the key at parent, whose children are
// names, at server time now: for a mutex the one holderOf finds; for a
// semaphore the permits in force, oldest first, as judgePermit counts
// them — the lowest claims in force and the holds, up to the limit.
func (b *Backend) holdersOf(ctx context.Context, key, parent string, names []string, now int64) ([]core.Info, error) {
	if !hasPermits(names) {
		info, err := b.holderOf(ctx, key, parent, names, now)
		if info == nil || err != nil {
			return nil, err
		}
		return []core.Info{*info}, nil
	}
	var claims []child
	var list []core.Info
	limit := 0
	for _, n := range names {
		c, ok := parseChild(n)
		if !ok {
			continue
		}
		if !c.hold {
			claims = append(claims, c)
			continue
		}
		if c.until <= now || c.limit < 2 {
			continue
		}
		info := core.Info{Key: key, ExpiresAt: msTime(c.until), Remaining: time.Duration(c.until-now) * time.Millisecond, Limit: c.limit}
		data, st, err := b.get(ctx, parent+"/"+n)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return nil, err
		}
		t, owner, _ := parseData(data)
		info.Owner, info.Token, info.AcquiredAt = owner, uint64(t), msTime(st.Ctime)
		list = append(list, info)
		limit = c.limit
	}
	sort.Slice(claims, func(i, j int) bool { return claims[i].seq < claims[j].seq })
	for _, c := range claims {
		if limit > 0 && len(list) >= limit {
			break
		}
		data, st, err := b.get(ctx, parent+"/"+c.name)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return nil, err
		}
		info, ok := claimHolder(key, data, st, now) // admin.go
		if !ok {
			continue
		}
		if limit == 0 {
			limit = max(c.limit, 1)
		}
		if max(c.limit, 1) != limit {
			break // a claim of another kind, above the holders: it does not hold
		}
		if c.limit > 1 {
			info.Limit = c.limit
		}
		list = append(list, info)
	}
	sort.SliceStable(list, func(i, j int) bool { return list[i].Token < list[j].Token })
	return list, nil
}
