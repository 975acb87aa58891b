package zklock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dislock/dislock/core"
)

// TryAcquire implements core.Backend with the ZooKeeper lock recipe: one
// multi creates an ephemeral sequential claim node under the key's node and
// touches the key node, whose returned stat carries the claim's zxid (the
// fencing token), the server time and the number of children. When the claim
// is the only child it holds the lock (one round trip); otherwise the lowest
// claim in force holds it, unless a hold (min hold, slot) is in force.
func (b *Backend) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	if err := core.ValidateKey(req.Key); err != nil {
		return core.Lease{}, err
	}
	slot := !req.ExpireAt.IsZero()
	ttl := req.TTL
	if slot {
		ttl = b.MaxTTL() // the claim is only a step towards the hold
	} else if max := b.MaxTTL(); ttl > max {
		return core.Lease{}, invalidOption("TTL", "%v is more than 2/3 of the ZooKeeper session timeout %v: use a TTL of at most %v or a longer session timeout",
			ttl, b.SessionTimeout(), max)
	}
	if ttl <= 0 {
		return core.Lease{}, invalidOption("TTL", "must be positive, got %v", ttl)
	}
	if req.Limit > core.MaxLimit {
		return core.Lease{}, invalidOption("Limit", "must be at most %d, got %d", core.MaxLimit, req.Limit)
	}
	permit := req.Limit > 1
	if req.Waiter != "" && !slot {
		return b.tryQueued(ctx, req, ttl)
	}
	if !permit && !slot {
		for {
			// A mutex this backend holds is busy without a request. (A
			// permit claim goes to the store: another permit may be free,
			// and a mutex held here is a limit mismatch.)
			if info, ok := b.knownBusy(req.Key); ok {
				return core.Lease{}, core.Busy(req.Key, info)
			}
			// One attempt per key at a time from this backend: a second
			// one could only lose to the first or to the same holder, and
			// its claim would stand in the first one's way. It waits for
			// the first to end, then asks again: when the first failed
			// (the store did not answer, say), that is no busy answer.
			b.mu.Lock()
			ahead := b.trying[req.Key]
			if ahead == nil {
				done := make(chan struct{})
				b.trying[req.Key] = done
				b.mu.Unlock()
				defer func() {
					b.mu.Lock()
					delete(b.trying, req.Key)
					b.mu.Unlock()
					close(done)
				}()
				break
			}
			b.mu.Unlock()
			select {
			case <-ahead:
			case <-ctx.Done():
				return core.Lease{}, core.Unclaimed(ctx.Err())
			}
		}
	}
	parent := b.keyPath(req.Key)
	tok := encodeName(req.OwnerToken)
	var c *claim
	regrant := false
	for round := 0; ; round++ {
		var (
			only bool
			now  int64
			err  error
		)
		c, now, only, err = b.claim(ctx, req, parent, tok, ttl, claimData(ttl, req.Owner))
		if err != nil {
			return core.Lease{}, err
		}
		created, sid := c.path, c.sid
		// fail gives the claim up: busy, or a limit mismatch.
		fail := func(info *core.Info, dropped <-chan error, mismatch int) (core.Lease, error) {
			b.forget(req.OwnerToken)
			var err error
			if dropped != nil {
				err = waitDropped(ctx, dropped)
			} else {
				err = b.del(ctx, created, -1)
			}
			if err != nil {
				b.bgDelete(created, sid)
			}
			if mismatch > 0 {
				return core.Lease{}, core.LimitMismatch(req.Key, mismatch, max(req.Limit, 1))
			}
			return core.Lease{}, core.Busy(req.Key, info)
		}
		busy := func(info *core.Info, dropped <-chan error) (core.Lease, error) { return fail(info, dropped, 0) }
		if slot && req.ExpireAt.UnixMilli() <= now {
			return busy(nil, nil) // the slot is over
		}
		if only {
			break
		}
		ours, _ := parseChild(created[len(parent)+1:])
		var v verdict
		if permit {
			v, err = b.judgePermit(ctx, req.Key, parent, ours, now, req.Limit, int64(c.token))
		} else {
			v, err = b.judge(ctx, req.Key, parent, ours, now, func() <-chan error { return b.dropAsync(created) }, false)
		}
		if err != nil {
			// The engine releases the claim by its owner token.
			if v.dropped != nil {
				waitDropped(ctx, v.dropped)
			}
			return core.Lease{}, err
		}
		if v.held {
			regrant = v.regrant
			break
		}
		if v.mismatch > 0 {
			return fail(nil, v.dropped, v.mismatch)
		}
		if !v.retry || round > 0 {
			return busy(v.info, v.dropped)
		}
		// Every claim below ours had run out and was deleted, but ours
		// was already being given up: claim again.
		b.forget(req.OwnerToken)
		if err := waitDropped(ctx, v.dropped); err != nil {
			// The store did not say the key is busy: a failure (the
			// store or ctx ended the wait), not busy.
			b.bgDelete(created, sid)
			return core.Lease{}, fmt.Errorf("zklock: claim %q: wait for the deletion of expired claims: %w", req.Key, err)
		}
	}
	if regrant {
		// Another permit may have been granted after our claim was made,
		// with a larger token: take one after it.
		st, err := b.grantWrite(ctx, parent, c.path, grantData(ttl, req.Owner), -1)
		if err != nil {
			return core.Lease{}, err // the engine releases the claim by its owner token
		}
		b.mu.Lock()
		c.token, c.tokenData = uint64(st.Mzxid), true
		b.mu.Unlock()
	}
	lease := core.Lease{Token: c.token, AcquiredAt: msTime(c.acqMs), ExpiresAt: msTime(c.acqMs).Add(ttl)}
	if !slot && permit {
		return lease, nil
	}
	if !slot {
		b.markHeld(req.Key, req.OwnerToken, core.Info{Key: req.Key, Owner: req.Owner, Token: c.token,
			AcquiredAt: lease.AcquiredAt, ExpiresAt: lease.ExpiresAt}, ttl, c.acqLocal)
		return lease, nil
	}
	// Hand the lock from the claim, which lives with the session, to a hold
	// that lives until the slot's end.
	until := req.ExpireAt.UnixMilli()
	hold := parent + "/" + holdName(until, tok, req.Limit)
	var merr error
	err := b.call(ctx, func() {
		_, merr = b.conn.Multi(
			&zk.CreateRequest{Path: hold, Data: holdData(c.token, req.Owner), Acl: b.acl, Flags: zk.FlagPersistent},
			// A write to the claim before its deletion: the waiter
			// behind it hears of a data change, not of a deletion, so
			// that it reads the children and finds the hold (see
			// armPlace).
			&zk.SetDataRequest{Path: c.path, Version: -1},
			&zk.DeleteRequest{Path: c.path, Version: -1},
		)
	}, nil)
	if err == nil {
		err = merr
	}
	// Either way the record goes: the engine never renews or releases a
	// slot session, and the undo of a hand-over in doubt finds the claim or
	// the hold by the owner token in their names.
	b.forget(req.OwnerToken)
	if err != nil {
		return core.Lease{}, fmt.Errorf("slot hold: %w", err)
	}
	lease.ExpiresAt = msTime(until)
	return lease, nil
}

// grantWrite grants the permit whose claim is at p with data (grantData),
// guarded by version (-1: any): one multi with a write to the key node, so
// that a claim judged after it sees that a grant came after it. The stat
// is the claim's: its mzxid is the permit's token.
func (b *Backend) grantWrite(ctx context.Context, parent, p string, data []byte, version int32) (*zk.Stat, error) {
	var res []zk.MultiResponse
	var err error
	if cerr := b.call(ctx, func() {
		res, err = b.conn.Multi(
			&zk.SetDataRequest{Path: parent, Data: nil, Version: -1},
			&zk.SetDataRequest{Path: p, Data: data, Version: version},
		)
	}, nil); cerr != nil {
		return nil, cerr
	}
	if err != nil {
		for _, r := range res {
			if r.Error != nil && !errors.Is(r.Error, zk.ErrAPIError) {
				return nil, r.Error
			}
		}
		return nil, err
	}
	if len(res) != 2 || res[1].Stat == nil {
		return nil, errors.New("unexpected multi reply")
	}
	return res[1].Stat, nil
}

// waitDropped waits for the deletion of a given-up claim, or for ctx: a
// deletion still running then goes on in the background and deletes the
// node when it gets through.
func waitDropped(ctx context.Context, dropped <-chan error) error {
	select {
	case err := <-dropped:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// claim creates the claim node of req and records it. It returns the server
// time of the creation and whether the claim is the key's only child.
func (b *Backend) claim(ctx context.Context, req core.AcquireRequest, parent, tok string, ttl time.Duration, data []byte) (*claim, int64, bool, error) {
	sent := time.Now()
	var res []zk.MultiResponse
	p, sid, err := b.createUnder(ctx, parent, func() (string, error) {
		var err error
		res, err = b.conn.Multi(
			&zk.CreateRequest{Path: parent + "/" + claimName(tok, req.Limit), Data: data, Acl: b.acl, Flags: zk.FlagEphemeralSequential},
			&zk.SetDataRequest{Path: parent, Data: nil, Version: -1},
		)
		if err != nil || len(res) != 2 {
			return "", err
		}
		return res[0].String, nil
	})
	if err != nil {
		return nil, 0, false, err
	}
	if res[1].Stat == nil {
		return nil, 0, false, errors.New("unexpected multi reply")
	}
	st := res[1].Stat
	b.sampleClock(st.Mtime)
	c := &claim{key: req.Key, path: p, owner: req.Owner, sid: sid, token: uint64(st.Mzxid), acqMs: st.Mtime, acqLocal: sent,
		limit: req.Limit}
	b.mu.Lock()
	b.claims[req.OwnerToken] = c
	b.mu.Unlock()
	return c, st.Mtime, st.NumChildren == 1, nil
}

// createUnder sends create, a request that makes one node under the key's
// container node parent and returns its path. A container this backend has
// not used lately is created first (a node that exists already fails, at
// no harm), rather than let create fail for the lack of it and send it
// again; one missing all the same is created and create sent again. A node
// made for a caller that gave up is deleted, and so is one whose session
// ended meanwhile (an error). It returns the node's path and session.
func (b *Backend) createUnder(ctx context.Context, parent string, create func() (string, error)) (string, int64, error) {
	sid := b.conn.SessionID()
	if !b.knownParent(parent) {
		if err := b.ensureParent(ctx, parent); err != nil {
			return "", 0, core.Unclaimed(fmt.Errorf("create %s: %w", parent, err))
		}
	}
	var (
		p   string
		err error
	)
	for attempt := 0; ; attempt++ {
		cerr := b.call(ctx, func() { p, err = create() }, func() {
			// The caller gave up: take back a node the server made.
			if err == nil && p != "" {
				b.bgDelete(p, sid)
			}
		})
		if cerr != nil {
			return "", 0, cerr
		}
		if errors.Is(err, zk.ErrNoNode) && attempt < 2 {
			if err := b.ensureParent(ctx, parent); err != nil {
				return "", 0, fmt.Errorf("create %s: %w", parent, err)
			}
			continue
		}
		break
	}
	if err == nil && p == "" {
		err = errors.New("unexpected create reply")
	}
	if err != nil {
		return "", 0, err
	}
	b.markParent(parent)
	after := b.conn.SessionID()
	if sid == 0 {
		// No session yet when the request was queued: it went out in the
		// first one.
		sid = after
	}
	if sid == 0 || after != sid {
		// The node may belong to a session that ended meanwhile; never
		// hand it out.
		b.bgDelete(p, sid)
		return "", 0, errors.New("the ZooKeeper session changed during the acquire")
	}
	return p, sid, nil
}

// dropAsync starts deleting our own claim at p and returns its outcome.
func (b *Backend) dropAsync(p string) <-chan error {
	out := make(chan error, 1)
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out <- b.del(ctx, p, -1)
	}()
	return out
}

// verdict is what judge decided.
type verdict struct {
	held     bool
	mismatch int          // the limit of the holders, when it differs from the claim's
	info     *core.Info   // the holder, when busy and known
	dropped  <-chan error // our claim is being deleted: its outcome
	retry    bool         // free after all, but our claim was dropped
	gone     bool         // our claim is gone (force release)
	regrant  bool         // a permit: another grant may have come after our claim
	names    []string     // the key's children as judged
	unread   bool         // busy behind a waiting place: the holder was not read
}

// childScan is what judge and judgePermit read of a key's children:
// whether our claim is among them, the claims below it and the holds in
// force, in the order of the names.
type childScan struct {
	found bool
	lower []child // claims below ours
	holds []child // holds in force
}

// scanChildren sorts names, the children of parent, for the claim ours at
// now (server clock, ms): names that are no child of the recipe are
// skipped, and holds whose time ran out are deleted on the way.
func (b *Backend) scanChildren(parent string, names []string, ours child, now int64) childScan {
	var sc childScan
	for _, n := range names {
		c, ok := parseChild(n)
		if !ok {
			continue
		}
		switch {
		case n == ours.name:
			sc.found = true
		case c.hold:
			if c.until <= now {
				b.bgDelete(parent+"/"+n, 0)
			} else {
				sc.holds = append(sc.holds, c)
			}
		case c.seq < ours.seq:
			sc.lower = append(sc.lower, c)
		}
	}
	return sc
}

// judge decides, from the children of parent, whether the claim ours
// created at server time now holds the lock; when not, it returns the
// holder when known. As soon as a hold or a lower claim is seen, our claim
// is given up (drop), in parallel with reading the holder, so that it
// blocks other acquirers as briefly as possible. Claims below ours whose TTL
// ran out without a renewal are deleted (guarded by their version, so a
// renewal in between wins); holds that ended are deleted. A queued place
// (a waiting Acquire's node) with more than one mutex claim below it reads
// none of them: it is busy (unread), and the place right behind the holder
// judges the holder.
func (b *Backend) judge(ctx context.Context, key, parent string, ours child, now int64, drop func() <-chan error, queued bool) (verdict, error) {
	names, _, err := b.childrenStat(ctx, parent)
	if err != nil {
		return verdict{}, err
	}
	sc := b.scanChildren(parent, names, ours, now)
	if !sc.found {
		return verdict{gone: true}, nil // deleted meanwhile (force release): not ours
	}
	lower := sc.lower
	var best *child
	permitHold := 0
	for i, c := range sc.holds {
		if c.limit > 0 {
			permitHold = max(permitHold, c.limit)
		} else if c.token != ours.token && (best == nil || c.until > best.until) {
			best = &sc.holds[i]
		}
	}
	v := verdict{names: names}
	if permitHold > 0 {
		v.dropped = drop()
		v.mismatch = permitHold // a semaphore's permit is held
		return v, nil
	}
	if best != nil {
		v.dropped = drop()
		info := core.Info{Key: key, ExpiresAt: msTime(best.until), Remaining: time.Duration(best.until-now) * time.Millisecond}
		var data []byte
		var gerr error
		if cerr := b.call(ctx, func() { data, _, gerr = b.conn.Get(parent + "/" + best.name) }, nil); cerr == nil && gerr == nil {
			if t, owner, err := parseData(data); err == nil {
				info.Owner, info.Token = owner, uint64(t)
			}
		}
		v.info = &info
		return v, nil
	}
	if len(lower) == 0 {
		v.held = true
		return v, nil
	}
	v.dropped = drop()
	if queued && len(lower) > 1 && !slices.ContainsFunc(lower, func(c child) bool { return c.limit > 0 }) {
		// A waiting place behind another: the place right behind the
		// holder judges the holder (its lease's end, its data), and
		// this one waits for its turn without a read of it.
		v.unread = true
		return v, nil
	}
	sort.Slice(lower, func(i, j int) bool { return lower[i].seq < lower[j].seq })
	for _, l := range lower {
		p := parent + "/" + l.name
		data, st, ch, err := b.getW(ctx, p)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return v, err
		}
		ttl, owner, perr := parseData(data)
		info := &core.Info{Key: key, Owner: owner, Token: ClaimToken(data, st), AcquiredAt: msTime(st.Ctime)}
		v.mismatch = l.limit // in force, if a permit: a semaphore holds the key
		if perr != nil {     // not ours to judge: in force
			b.armWatch(p, key, ch)
			v.info = info
			return v, nil
		}
		exp := st.Mtime + ttl
		info.ExpiresAt = msTime(exp)
		if exp > now {
			info.Remaining = time.Duration(exp-now) * time.Millisecond
			b.armWatch(p, key, ch)
			v.info = info
			return v, nil
		}
		// Not renewed within its TTL: the holder's renew deadline passed
		// long ago. Delete exactly the version we judged.
		switch derr := b.deleteVersion(ctx, p, st.Version); {
		case derr == nil, errors.Is(derr, zk.ErrNoNode):
			v.mismatch = 0
			continue
		case errors.Is(derr, zk.ErrBadVersion): // renewed meanwhile
			v.mismatch = l.limit
			info.Remaining = time.Duration(ttl) * time.Millisecond
			info.ExpiresAt = msTime(now + ttl)
			b.armWatch(p, key, ch)
			v.info = info
			return v, nil
		default:
			return v, derr
		}
	}
	v.retry = true
	return v, nil
}

// childrenStat reads the children of parent and its stat, within ctx;
// unlike children, it reports a missing parent (zk.ErrNoNode).
func (b *Backend) childrenStat(ctx context.Context, parent string) ([]string, *zk.Stat, error) {
	var (
		names []string
		st    *zk.Stat
		err   error
	)
	if cerr := b.call(ctx, func() { names, st, err = b.conn.Children(parent) }, nil); cerr != nil {
		return nil, nil, cerr
	}
	return names, st, err
}

// getW reads node p within ctx, and sets a watch on it when a Watch
// subscriber would be told of its deletion (see armWatch).
func (b *Backend) getW(ctx context.Context, p string) ([]byte, *zk.Stat, <-chan zk.Event, error) {
	var (
		data []byte
		st   *zk.Stat
		ch   <-chan zk.Event
		err  error
	)
	b.mu.Lock()
	watch := len(b.subs) > 0
	b.mu.Unlock()
	read := func() { data, st, err = b.conn.Get(p) }
	if watch {
		read = func() { data, st, ch, err = b.conn.GetW(p) }
	}
	if cerr := b.call(ctx, read, nil); cerr != nil {
		return nil, nil, nil, cerr
	}
	return data, st, ch, err
}

// deleteVersion deletes node p if it is still at version, within ctx.
func (b *Backend) deleteVersion(ctx context.Context, p string, version int32) error {
	var err error
	if cerr := b.call(ctx, func() { err = b.conn.Delete(p, version) }, nil); cerr != nil {
		return cerr
	}
	return err
}

// forget drops the record of a claim.
func (b *Backend) forget(ownerToken string) {
	b.mu.Lock()
	delete(b.claims, ownerToken)
	b.mu.Unlock()
}

// del deletes p, treating a missing node as deleted.
func (b *Backend) del(ctx context.Context, p string, version int32) error {
	var err error
	if cerr := b.call(ctx, func() { err = b.conn.Delete(p, version) }, nil); cerr != nil {
		return cerr
	}
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		return err
	}
	return nil
}

// bgDelete deletes p in the background, retrying a few times. sid, when not
// 0, is the session of an ephemeral p: once it ends, p is gone anyway.
func (b *Backend) bgDelete(p string, sid int64) {
	b.spawn(func() {
		wait := 50 * time.Millisecond
		for range 8 {
			if sid != 0 && b.conn.SessionID() != sid {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := b.del(ctx, p, -1)
			cancel()
			if err == nil || errors.Is(err, errClosed) {
				return
			}
			select {
			case <-b.done:
				return
			case <-time.After(wait):
			}
			wait *= 2
		}
	})
}

// Now implements core.Backend: it writes <root>/clock and returns the
// modification time the leader stamped on it. The clock is the ensemble's,
// not the key's: ZooKeeper does not shard.
func (b *Backend) Now(ctx context.Context, key string) (time.Time, error) {
	for attempt := 0; ; attempt++ {
		var st *zk.Stat
		var err error
		if cerr := b.call(ctx, func() { st, err = b.conn.Set(b.clock, nil, -1) }, nil); cerr != nil {
			return time.Time{}, cerr
		}
		if err == nil {
			return msTime(st.Mtime), nil
		}
		if !errors.Is(err, zk.ErrNoNode) || attempt > 0 {
			return time.Time{}, err
		}
		if err := b.ensurePath(ctx, b.clock); err != nil {
			return time.Time{}, fmt.Errorf("create %s: %w", b.clock, err)
		}
	}
}
