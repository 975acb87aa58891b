package zklock

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dislock/dislock/core"
)

// holderOf finds who holds the key at parent at server time now: the hold
// in force that ends last, otherwise the lowest claim still in force.
// names are parent's children.
func (b *Backend) holderOf(ctx context.Context, key, parent string, names []string, now int64) (*core.Info, error) {
	var best *child
	var claims []child
	for _, n := range names {
		c, ok := parseChild(n)
		if !ok {
			continue
		}
		if c.hold {
			if c.until > now && (best == nil || c.until > best.until) {
				best = &c
			}
			continue
		}
		claims = append(claims, c)
	}
	if best != nil {
		data, st, err := b.get(ctx, parent+"/"+best.name)
		if err == nil {
			t, owner, _ := parseData(data)
			return &core.Info{Key: key, Owner: owner, Token: uint64(t), AcquiredAt: msTime(st.Ctime),
				ExpiresAt: msTime(best.until), Remaining: time.Duration(best.until-now) * time.Millisecond}, nil
		}
		if !errors.Is(err, zk.ErrNoNode) {
			return nil, err
		}
	}
	sort.Slice(claims, func(i, j int) bool { return claims[i].seq < claims[j].seq })
	for _, c := range claims {
		data, st, err := b.get(ctx, parent+"/"+c.name)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if info, ok := claimHolder(key, data, st, now); ok {
			return &info, nil
		}
	}
	return nil, nil
}

// claimHolder reads claim node data (stat st) of key: the Info of its
// holder, and whether it holds at now. A place in line holds nothing; nor
// does a claim whose holder stopped renewing (free for the next acquirer).
// A claim whose data cannot be parsed holds, with no expiry known.
func claimHolder(key string, data []byte, st *zk.Stat, now int64) (core.Info, bool) {
	if isWaitData(data) {
		return core.Info{}, false
	}
	ttl, owner, perr := parseData(data)
	info := core.Info{Key: key, Owner: owner, Token: ClaimToken(data, st), AcquiredAt: msTime(st.Ctime)}
	if perr != nil {
		return info, true
	}
	exp := st.Mtime + ttl
	if exp <= now {
		return info, false
	}
	info.ExpiresAt = msTime(exp)
	info.Remaining = time.Duration(exp-now) * time.Millisecond
	return info, true
}

// children lists parent's children; a missing parent has none. With sync
// it first brings the server it asks up to date with the leader (a
// follower may not have applied a claim another session's server has
// acknowledged yet): the admin calls read what every earlier acknowledged
// write left, one sync each.
func (b *Backend) children(ctx context.Context, parent string, sync bool) ([]string, error) {
	var names []string
	var err error
	if cerr := b.call(ctx, func() {
		if sync {
			if _, err = b.conn.Sync(parent); err != nil && !errors.Is(err, zk.ErrNoNode) {
				return
			}
		}
		names, _, err = b.conn.Children(parent)
	}, nil); cerr != nil {
		return nil, cerr
	}
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	return names, err
}

// Inspect implements core.Admin. Times are on the server clock: AcquiredAt
// is the holder's node's creation, ExpiresAt the last renewal plus the TTL
// (or a hold's end). It costs one write, to read the server clock.
func (b *Backend) Inspect(ctx context.Context, key string) (core.Info, bool, error) {
	if err := core.ValidateKey(key); err != nil {
		return core.Info{}, false, err
	}
	info, err := b.inspect(ctx, key)
	if err != nil {
		return core.Info{}, false, fmt.Errorf("zklock: inspect: %w", err)
	}
	if info == nil {
		return core.Info{}, false, nil
	}
	return *info, true, nil
}

func (b *Backend) inspect(ctx context.Context, key string) (*core.Info, error) {
	list, err := b.holders(ctx, key)
	if err != nil || len(list) == 0 {
		return nil, err
	}
	return &list[0], nil // a semaphore's oldest permit
}

// List implements core.Admin: the held locks whose key starts with prefix,
// sorted by key, with one Info per permit of a semaphore (oldest first).
func (b *Backend) List(ctx context.Context, prefix string) ([]core.Info, error) {
	names, err := b.children(ctx, b.locks, true)
	if err != nil {
		return nil, fmt.Errorf("zklock: list: %w", err)
	}
	var keys []string
	for _, n := range names {
		k, err := decodeName(n)
		if err == nil && strings.HasPrefix(k, prefix) && core.ValidateKey(k) == nil {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	if len(keys) == 0 {
		return nil, nil
	}
	now, err := b.Now(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("zklock: list: %w", err)
	}
	infos := make([][]core.Info, len(keys))
	errs := make([]error, len(keys))
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			parent := b.keyPath(k)
			kids, err := b.children(ctx, parent, false)
			if err == nil && len(kids) > 0 {
				infos[i], err = b.holdersOf(ctx, k, parent, kids, now.UnixMilli())
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("zklock: list: %w", err)
	}
	list := make([]core.Info, 0, len(keys))
	for _, i := range infos {
		list = append(list, i...)
	}
	return list, nil
}

// ForceRelease implements core.Admin: it deletes every claim and hold of
// key. The holder's next renewal finds its claim gone and reports the loss.
// released says whether a holder was in force.
func (b *Backend) ForceRelease(ctx context.Context, key string) (bool, error) {
	if err := core.ValidateKey(key); err != nil {
		return false, err
	}
	b.unmarkHeld(key, "")
	parent := b.keyPath(key)
	names, err := b.children(ctx, parent, true)
	if err != nil {
		return false, fmt.Errorf("zklock: force release: %w", err)
	}
	if len(names) == 0 {
		return false, nil
	}
	now, err := b.Now(ctx, key)
	if err != nil {
		return false, fmt.Errorf("zklock: force release: %w", err)
	}
	held, err := b.holdersOf(ctx, key, parent, names, now.UnixMilli())
	if err != nil {
		return false, fmt.Errorf("zklock: force release: %w", err)
	}
	var errs []error
	watched := false
	for _, n := range names {
		if _, ok := parseChild(n); !ok {
			continue
		}
		p := parent + "/" + n
		// A waiting Acquire's place in line stays: the queue outlives the
		// holder, and the first waiter is told by its watch on the node
		// deleted before it.
		var data []byte
		var gerr error
		if cerr := b.call(ctx, func() { data, _, gerr = b.conn.Get(p) }, nil); cerr != nil {
			return false, fmt.Errorf("zklock: force release: %w", cerr)
		}
		if errors.Is(gerr, zk.ErrNoNode) || (gerr == nil && isWaitData(data)) {
			continue
		}
		b.mu.Lock()
		_, w := b.watches[p]
		b.mu.Unlock()
		watched = watched || w
		errs = append(errs, b.del(ctx, p, -1))
	}
	if err := errors.Join(errs...); err != nil {
		return false, fmt.Errorf("zklock: force release: %w", err)
	}
	if !watched {
		b.echo(key, "")
	}
	return len(held) > 0, nil
}
