package zklock

import (
	"context"
	"errors"
	"path"
	"sort"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dislock/dislock/core"
)

var _ core.Queuer = (*Backend)(nil)

// Waiters in line (core.Queuer), the ZooKeeper recipe's way. A waiting
// Acquire keeps its claim node, named by its Waiter, from one attempt to
// the next: its sequence number is its place in line. The lowest nodes
// hold (see judge and judgePermit), so a release lets exactly the next
// waiter in, across processes, first come first served. The waiter's
// backend watches the node before it (a mutex) and tells the waiter its
// turn when it is first in line; when that node was the only one before it
// and is deleted while the waiter's own node stands (a data watch on it
// has not fired), the grant needs no read (see followPlace), and the turn
// is told as the deletion's event arrives (see onEvent). The place
// learns that it is next from the grant of the node before it; when that
// node is a waiting place that is never kept (see neverKept), from the
// grant's data change alone, with no read, and a child watch on the node,
// armed with its data watch, tells of its deletion (see armPred). A
// waiter whose process
// dies goes with its session; one whose Acquire gave up is deleted (Leave),
// and one whose Acquire stopped trying is deleted by its own backend when
// its WaiterTTL runs out: the waiter behind is told at once, without a
// poll.
//
// Semaphores follow the same queue: a waiter is told its turn when no
// waiting place is before it and fewer nodes in force are, with the
// holds, than the key has permits. It watches the nearest waiting place
// before it (its grant rewrites the node's data) or, when first, every
// node before it.

// place is a waiting Acquire's node in line.
type place struct {
	key, waiter string
	path, name  string // "" while uncertain: a create whose reply was lost
	owner       string
	sid         int64
	limit       int
	version     int32  // of the node's data, as this backend last wrote it
	token       uint64 // the node's czxid, when this backend created it (0: not known)
	claimData   bool   // created with a claim's data: rewritten when it waits
	until       time.Time
	timer       *time.Timer
	stop        chan struct{} // closed when the place ends

	// Guarded by Backend.mu.
	settled bool       // watches armed and nothing fired since
	told    bool       // told its turn since its waiter's last attempt began (see tellTurn)
	info    *core.Info // the holder the last judgement named
	infoEnd time.Time  // local: when that holder's lease runs out
	unread  bool       // judged behind a waiting place: the holder not read
	armed   map[string]bool
	aloneOn string // a mutex's place with one node before it and no hold: that node's path
	// noKeep is the node before a mutex's place, when it was a waiting
	// place that is never kept as its watch was armed: its next data
	// change is its grant, after which pl is next without a read.
	// Backend.noKeepOn maps it back to pl, for onEvent.
	noKeep string
	gone   string // a node whose deletion a watch reported (both its watches may)
	fast   bool   // that node was deleted: granted without a read
	// granted is the node before the place whose grant onEvent acted on,
	// until followPlace gets the event (see onEvent).
	granted string
	// own is a data watch on the place's own node, armed with the
	// watches on the node before it (armPred). A grant without a read
	// needs the node to be there still: a
	// node deleted behind the backend's back (an operator's delete of the
	// key's nodes, in any order) tells it through own, and the server
	// sends that event before the event of any later deletion.
	own    <-chan zk.Event
	evalMu sync.Mutex
}

func placeKey(key, waiter string) string { return key + "\x00" + waiter }

// tryQueued is TryAcquire for a waiting Acquire (req.Waiter set).
func (b *Backend) tryQueued(ctx context.Context, req core.AcquireRequest, ttl time.Duration) (core.Lease, error) {
	sent := time.Now()
	parent := b.keyPath(req.Key)
	tok := encodeName(req.Waiter)
	pk := placeKey(req.Key, req.Waiter)
	b.mu.Lock()
	if gone := b.leaving[pk]; gone != nil {
		// This wait's expired place is being deleted; when its node was
		// uncertain, the deletion finds it by the waiter's name, which a
		// node made now would share: wait for it first.
		b.mu.Unlock()
		select {
		case <-gone:
		case <-ctx.Done():
			return core.Lease{}, ctx.Err()
		}
		b.mu.Lock()
	}
	pl := b.places[pk]
	if pl != nil && (pl.limit != req.Limit || (pl.path != "" && pl.sid != b.conn.SessionID())) {
		// Another limit, or a place that went with its session.
		b.dropPlaceLocked(pk, pl)
		if pl.path != "" {
			b.bgDelete(pl.path, pl.sid)
		}
		pl = nil
	}
	if pl != nil {
		b.refreshLocked(pl, sent.Add(req.WaiterTTL))
		pl.told = false // a turn from now on is news to the waiter
		if pl.settled && pl.path != "" && req.Limit <= 1 && !(pl.unread && pl.aloneOn != "") && (pl.info == nil || time.Until(pl.infoEnd) > 0) {
			// The node before it is still there (its watch has not
			// fired): still busy, without a request. The holder's expiry
			// (infoEnd) is checked on the store; a place that came next
			// to a holder it has not read reads it. (A semaphore's waiter
			// may be let in by a release its watches do not see.)
			var info *core.Info
			if pl.info != nil {
				i := *pl.info
				i.Remaining = time.Until(pl.infoEnd)
				info = &i
			}
			b.mu.Unlock()
			return core.Lease{}, core.Busy(req.Key, info)
		}
		pl.settled = false
	}
	fast := pl != nil && pl.fast && pl.path != ""
	if pl != nil {
		pl.fast = false
	}
	_, contended := b.held[req.Key]
	contended = contended || pl != nil || time.Since(b.busyAt[req.Key]) < time.Second
	b.mu.Unlock()

	if pl != nil && pl.path == "" {
		if err := b.adopt(ctx, pl, parent, tok); err != nil {
			return core.Lease{}, err
		}
		if pl.path == "" {
			b.mu.Lock()
			b.dropPlaceLocked(pk, pl)
			b.mu.Unlock()
			pl = nil
		}
	}
	for round := 0; ; round++ {
		var (
			c     *claim
			now   int64
			only  bool
			fresh bool // our node was created by this attempt with claim data
			err   error
		)
		if pl == nil {
			data := claimData(ttl, req.Owner)
			if contended {
				data = waitData(req.Owner, req.MinHold)
			}
			if contended && req.Limit <= 1 {
				c, err = b.enqueue(ctx, req, parent, tok, data)
				now = b.serverNow()
			} else {
				c, now, only, err = b.claim(ctx, req, parent, tok, ttl, data)
			}
			if err != nil {
				// The node may exist: remember the place as uncertain,
				// so that the next attempt or Leave finds it by name.
				b.newPlace(pk, req, &place{}, sent)
				return core.Lease{}, err
			}
			b.forget(req.OwnerToken) // recorded again once granted
			pl = b.newPlace(pk, req, &place{path: c.path, name: c.path[len(parent)+1:], sid: c.sid, claimData: !contended, token: c.token}, sent)
			fresh = !contended
		} else {
			now = b.serverNow()
		}
		ours, _ := parseChild(pl.name)
		var v verdict
		if only || (fast && round == 0) {
			v.held = true
		} else {
			noDrop := func() <-chan error { return nil }
			for {
				if req.Limit > 1 {
					mine := int64(0)
					if fresh {
						mine = int64(c.token)
					}
					v, err = b.judgePermit(ctx, req.Key, parent, ours, now, req.Limit, mine)
				} else {
					v, err = b.judge(ctx, req.Key, parent, ours, now, noDrop, true)
				}
				if err != nil || !v.retry {
					break
				}
			}
			if err != nil {
				return core.Lease{}, err // the place stays
			}
		}
		switch {
		case v.gone:
			b.mu.Lock()
			b.dropPlaceLocked(pk, pl)
			b.mu.Unlock()
			pl = nil
			if round == 0 {
				continue // force-released or stolen: queue again
			}
			return core.Lease{}, core.Busy(req.Key, nil)
		case v.mismatch > 0:
			b.leavePlace(ctx, pk, pl)
			return core.Lease{}, core.LimitMismatch(req.Key, v.mismatch, max(req.Limit, 1))
		case v.held:
			return b.grant(ctx, req, pk, pl, c, fresh && !v.regrant, ttl, sent)
		}
		// Busy: the place stays in line, as a waiting place.
		if pl.claimData {
			var st *zk.Stat
			var serr error
			if cerr := b.call(ctx, func() { st, serr = b.conn.Set(pl.path, waitData(req.Owner, req.MinHold), pl.version) }, nil); cerr != nil {
				return core.Lease{}, cerr
			}
			if serr != nil {
				b.leavePlace(ctx, pk, pl)
				return core.Lease{}, serr
			}
			pl.version, pl.claimData = st.Version, false
		}
		b.mu.Lock()
		b.busyAt[req.Key] = time.Now()
		if len(b.busyAt) > 4096 {
			for k, at := range b.busyAt {
				if time.Since(at) > time.Second {
					delete(b.busyAt, k)
				}
			}
		}
		pl.info, pl.unread = v.info, v.unread
		if v.info != nil && v.info.Remaining > 0 {
			pl.infoEnd = sent.Add(v.info.Remaining)
		} else {
			pl.info, pl.infoEnd = nil, time.Time{}
		}
		b.mu.Unlock()
		b.evaluateIn(ctx, pl, v.names) // within the caller's ctx
		return core.Lease{}, core.Busy(req.Key, v.info)
	}
}

// enqueue creates a mutex's waiting place for req (data: waitData) with a
// plain create: unlike a claim, it needs neither the server's time nor the
// fencing token at once. Its token, the node's czxid, comes with the read
// that watches the node once it is next (armOwn), before a grant without a
// read can hand it out.
func (b *Backend) enqueue(ctx context.Context, req core.AcquireRequest, parent, tok string, data []byte) (*claim, error) {
	p, sid, err := b.createUnder(ctx, parent, func() (string, error) {
		return b.conn.Create(parent+"/"+claimName(tok, req.Limit), data, zk.FlagEphemeralSequential, b.acl)
	})
	if err != nil {
		return nil, err
	}
	return &claim{key: req.Key, path: p, owner: req.Owner, sid: sid, limit: req.Limit}, nil
}

// newPlace records pl as the place of the wait pk (replacing any), until
// sent + WaiterTTL.
func (b *Backend) newPlace(pk string, req core.AcquireRequest, pl *place, sent time.Time) *place {
	pl.key, pl.waiter, pl.owner, pl.limit = req.Key, req.Waiter, req.Owner, req.Limit
	pl.stop = make(chan struct{})
	pl.armed = make(map[string]bool)
	b.mu.Lock()
	defer b.mu.Unlock()
	if old := b.places[pk]; old != nil {
		b.dropPlaceLocked(pk, old)
	}
	b.places[pk] = pl
	pl.until = sent.Add(req.WaiterTTL)
	pl.timer = time.AfterFunc(time.Until(pl.until), func() { b.expirePlace(pk, pl) })
	return pl
}

// refreshLocked keeps pl until until.
func (b *Backend) refreshLocked(pl *place, until time.Time) {
	if until.After(pl.until) {
		pl.until = until
		pl.timer.Reset(time.Until(until))
	}
}

// expirePlace ends a place whose WaiterTTL ran out: its wait stopped
// trying. The node is deleted, which tells the waiter behind.
func (b *Backend) expirePlace(pk string, pl *place) {
	b.mu.Lock()
	if b.places[pk] != pl {
		b.mu.Unlock()
		return
	}
	if left := time.Until(pl.until); left > 0 {
		pl.timer.Reset(left)
		b.mu.Unlock()
		return
	}
	b.dropPlaceLocked(pk, pl)
	gone := make(chan struct{})
	b.leaving[pk] = gone
	b.mu.Unlock()
	left := func() {
		b.mu.Lock()
		delete(b.leaving, pk)
		b.mu.Unlock()
		close(gone)
	}
	if !b.spawn(func() {
		defer left()
		if b.expireHook != nil {
			defer b.expireHook()()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		b.deletePlace(ctx, pl)
	}) {
		left() // closed
	}
}

// dropPlaceLocked forgets pl without deleting its node.
func (b *Backend) dropPlaceLocked(pk string, pl *place) {
	if b.places[pk] == pl {
		delete(b.places, pk)
	}
	b.setNoKeepLocked(pl, "")
	select {
	case <-pl.stop:
	default:
		close(pl.stop)
		pl.timer.Stop()
	}
}

// leavePlace forgets pl and deletes its node.
func (b *Backend) leavePlace(ctx context.Context, pk string, pl *place) error {
	b.mu.Lock()
	b.dropPlaceLocked(pk, pl)
	b.mu.Unlock()
	return b.deletePlace(ctx, pl)
}

// deletePlace deletes the node of pl, found by its name when uncertain;
// in the background when ctx is too short.
func (b *Backend) deletePlace(ctx context.Context, pl *place) error {
	if pl.path == "" {
		parent := b.keyPath(pl.key)
		if err := b.adopt(ctx, pl, parent, encodeName(pl.waiter)); err != nil || pl.path == "" {
			return err
		}
	}
	err := b.del(ctx, pl.path, -1)
	if err != nil && !errors.Is(err, errClosed) {
		b.bgDelete(pl.path, pl.sid)
	}
	return err
}

// adopt looks for the node of pl's waiter among the key's children (a
// create whose reply was lost) and records it in pl when found.
func (b *Backend) adopt(ctx context.Context, pl *place, parent, tok string) error {
	names, err := b.children(ctx, parent, true)
	if err != nil {
		return err
	}
	sid := b.conn.SessionID()
	for _, n := range names {
		if c, ok := parseChild(n); ok && !c.hold && c.token == tok {
			b.mu.Lock()
			pl.path, pl.name, pl.sid, pl.version = parent+"/"+n, n, sid, -1
			b.mu.Unlock()
			return nil
		}
	}
	return nil
}

// grant makes the place pl the lease of req: the node created by this
// attempt with claim data holds as it is; a waiting place is rewritten as a
// claim, which starts its lease on the server's clock (a watch of the
// waiter behind sees it: a grant that leaves a permit free passes the
// turn).
//
// A mutex's waiting place whose node this backend made holds the key from
// its turn on, before the rewrite: it is the lowest node in force (the
// grant rule found it so, and no node can come before a node that exists),
// and a waiting place is never judged by a TTL, so no other claim can hold
// while it stands. Its rewrite is then sent without waiting for the reply
// (grantAsync), and the lease is handed out at once: the hand-off costs the
// new holder no round trip. The engine counts the lease from before the
// rewrite was sent, so the store keeps it at least as long as the engine
// believes it held. A node that has claim data (a claim kept as a place, or
// one whose rewrite as a place failed) is judged by its TTL and is rewritten
// before the grant, as is a permit (its token is its grant's zxid).
func (b *Backend) grant(ctx context.Context, req core.AcquireRequest, pk string, pl *place, c *claim, fresh bool, ttl time.Duration, sent time.Time) (core.Lease, error) {
	b.mu.Lock()
	b.dropPlaceLocked(pk, pl)
	token := pl.token // armOwn may have learnt it
	b.mu.Unlock()
	if !fresh && req.Limit <= 1 && token != 0 && !pl.claimData {
		c = &claim{path: pl.path, sid: pl.sid, token: token, acqMs: b.serverNow()}
		b.grantAsync(pl.path, pl.sid, claimData(ttl, req.Owner), pl.version)
	} else if !fresh {
		var st *zk.Stat
		var err error
		write := func() { st, err = b.conn.Set(pl.path, claimData(ttl, req.Owner), pl.version) }
		if req.Limit > 1 {
			// A permit's token is its grant's zxid: waiters may take
			// permits out of line order (see grantData).
			write = func() {
				st, err = b.grantWrite(context.Background(), b.keyPath(req.Key), pl.path, grantData(ttl, req.Owner), pl.version)
			}
		}
		if cerr := b.call(ctx, write, nil); cerr != nil {
			// Not granted: the node goes (a delete sent after the grant
			// reaches the server after it).
			b.bgDelete(pl.path, pl.sid)
			return core.Lease{}, cerr
		}
		if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
			return core.Lease{}, core.Busy(req.Key, nil) // taken from it: queue again
		}
		if err != nil {
			b.bgDelete(pl.path, pl.sid)
			return core.Lease{}, err
		}
		c = &claim{path: pl.path, sid: pl.sid, token: uint64(st.Czxid), acqMs: st.Mtime}
		if req.Limit > 1 {
			c.token, c.tokenData = uint64(st.Mzxid), true
		}
		b.sampleClock(st.Mtime)
	}
	c.key, c.owner, c.limit, c.acqLocal = req.Key, req.Owner, req.Limit, sent
	if b.conn.SessionID() != c.sid {
		b.bgDelete(c.path, c.sid)
		return core.Lease{}, errors.New("the ZooKeeper session changed during the acquire")
	}
	b.mu.Lock()
	b.claims[req.OwnerToken] = c
	b.mu.Unlock()
	lease := core.Lease{Token: c.token, AcquiredAt: msTime(c.acqMs), ExpiresAt: msTime(c.acqMs).Add(ttl)}
	if req.Limit <= 1 {
		b.markHeld(req.Key, req.OwnerToken, core.Info{Key: req.Key, Owner: req.Owner, Token: c.token,
			AcquiredAt: lease.AcquiredAt, ExpiresAt: lease.ExpiresAt}, ttl, sent)
	}
	return lease, nil
}

// grantAsync rewrites the waiting place at p (of session sid, at version)
// as a claim with data, in the background, trying again while the store
// does not answer, until the node is rewritten, gone (released, or gone
// with its session), or changed since (renewed: a renewal writes claim data
// too), or the Backend is closed. Until it lands the node is a waiting
// place, which holds as the lowest node in force while its session lives
// and is never judged by a TTL; so it does not give up while the session
// lives, lest a lease its engine lost (the store out of reach past the
// renew deadline) keep the key as a place after the store is back.
func (b *Backend) grantAsync(p string, sid int64, data []byte, version int32) {
	b.spawn(func() {
		wait := 50 * time.Millisecond
		for {
			if b.conn.SessionID() != sid {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			var st *zk.Stat
			var err error
			cerr := b.call(ctx, func() { st, err = b.conn.Set(p, data, version) }, nil)
			cancel()
			switch {
			case errors.Is(cerr, errClosed):
				return
			case cerr == nil && err == nil:
				b.sampleClock(st.Mtime)
				return
			case cerr == nil && !errors.Is(err, zk.ErrConnectionClosed):
				// The server answered (no node, another version, a
				// refusal), or the client is closing: nothing to retry.
				return
			}
			select {
			case <-b.done:
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, time.Second)
		}
	})
}

// evaluate decides, from the key's children (names; read when nil),
// whether it is pl's turn, tells its waiter when it is, and
// otherwise watches what must change first. Its store calls are bounded by
// the backend's own time (a watch fired, say); an attempt evaluates its
// place within its caller's ctx (evaluateIn).
func (b *Backend) evaluate(pl *place, names []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b.evaluateIn(ctx, pl, names)
}

// evaluateIn is evaluate with its store calls within ctx. A watch that ctx
// cut short is armed again in the background (see armPlace); a place whose
// own node it could not watch is told its turn, so that its waiter's next
// attempt judges the line afresh.
func (b *Backend) evaluateIn(ctx context.Context, pl *place, names []string) {
	pl.evalMu.Lock()
	defer pl.evalMu.Unlock()
	if b.evaluateHook != nil {
		b.evaluateHook()
	}
	select {
	case <-pl.stop:
		return
	default:
	}
	parent := b.keyPath(pl.key)
	if names == nil {
		var err error
		names, err = b.children(ctx, parent, false)
		if err != nil {
			b.tellTurn(pl) // the attempt finds out
			return
		}
	}
	now := b.serverNow()
	var before []child
	found := false
	var holds []string
	for _, n := range names {
		c, ok := parseChild(n)
		switch {
		case !ok:
		case n == pl.name:
			found = true
		case c.hold:
			if c.until > now {
				holds = append(holds, n)
			}
		default:
			if s, _ := parseChild(pl.name); c.seq < s.seq {
				before = append(before, c)
			}
		}
	}
	if !found {
		b.tellTurn(pl) // gone: the attempt queues again
		return
	}
	sort.Slice(before, func(i, j int) bool { return before[i].seq < before[j].seq })
	var watch []string // nodes whose deletion may make it pl's turn
	var dataWatch, pred string
	limit := max(pl.limit, 1)
	if limit == 1 {
		if len(before) == 0 && len(holds) == 0 {
			// First, and no node can come before it (nor a hold, which
			// only a node before it makes): its grant needs no read.
			b.mu.Lock()
			pl.fast = true
			b.mu.Unlock()
			b.tellTurn(pl)
			return
		}
		b.mu.Lock()
		pl.aloneOn = ""
		if len(before) == 1 && len(holds) == 0 {
			pl.aloneOn = parent + "/" + before[0].name
		}
		b.mu.Unlock()
		if len(before) > 0 {
			// The node just before it: its grant (or renewal) tells this
			// place that it is next (see armPred).
			pred = parent + "/" + before[len(before)-1].name
		} else {
			watch = holds
		}
	} else {
		// The nearest waiting place before pl, if any, must be granted or
		// gone before it is pl's turn.
		for i := len(before) - 1; i >= 0 && dataWatch == ""; i-- {
			var data []byte
			var err error
			if cerr := b.call(ctx, func() { data, _, err = b.conn.Get(parent + "/" + before[i].name) }, nil); cerr != nil || (err != nil && !errors.Is(err, zk.ErrNoNode)) {
				b.tellTurn(pl)
				return
			}
			if err == nil && isWaitData(data) {
				dataWatch = before[i].name
			}
		}
		if dataWatch == "" {
			if len(before)+len(holds) < limit {
				b.tellTurn(pl)
				return
			}
			for _, c := range before {
				watch = append(watch, c.name)
			}
			watch = append(watch, holds...)
		}
	}
	b.mu.Lock()
	// A hold ends by time, not by a deletion: its end is checked on the
	// store (the busy answer's remaining time).
	pl.settled = len(holds) == 0
	b.mu.Unlock()
	if pred != "" && !b.armPred(ctx, pl, pred) {
		b.tellTurn(pl) // gone, or the store failed: the attempt finds out
		return
	}
	if dataWatch != "" {
		b.armPlace(ctx, pl, parent+"/"+dataWatch, true)
	}
	for _, n := range watch {
		b.armPlace(ctx, pl, parent+"/"+n, false)
	}
}

// armPlace sets a watch on p for pl: a data watch, which a grant fires,
// or a child watch, which only the deletion of a node without children
// fires (not the renewals of a claim). When it fires, pl is evaluated again.
func (b *Backend) armPlace(ctx context.Context, pl *place, p string, data bool) {
	if ok, _ := b.tryArm(ctx, pl, p, data); !ok {
		b.spawn(func() { b.evaluate(pl, nil) })
	}
}

// tryArm is armPlace without the evaluation when p is gone already or
// the store failed, which it reports as false. For a data watch it also
// reports whether p is a waiting place that is never kept (see
// isNeverKept): as read now, or, when the watch was armed already, as
// recorded then (pl.noKeep).
func (b *Backend) tryArm(ctx context.Context, pl *place, p string, data bool) (armed, neverKept bool) {
	b.mu.Lock()
	id := p
	if data {
		id += "\x00d"
	}
	if pl.armed[id] {
		neverKept = pl.noKeep == p
		b.mu.Unlock()
		return true, neverKept
	}
	pl.armed[id] = true
	b.mu.Unlock()
	var (
		ch   <-chan zk.Event
		err  error
		node []byte
	)
	if b.armHook != nil {
		defer b.armHook(p, data)()
	}
	if cerr := b.call(ctx, func() {
		if data {
			// (A read, not an exists watch, which on a node gone already
			// would wait for its creation until the session ends.)
			node, _, ch, err = b.conn.GetW(p)
		} else {
			_, _, ch, err = b.conn.ChildrenW(p)
		}
	}, nil); cerr != nil || err != nil {
		// Gone already (or the store failed): evaluate again.
		b.mu.Lock()
		delete(pl.armed, id)
		pl.settled = false
		b.mu.Unlock()
		return false, false
	}
	b.spawn(func() { b.followPlace(pl, p, id, data, ch) })
	return true, data && isNeverKept(node)
}

// armPred arms, for the mutex place pl, the watches on p, the node just
// before it, and the one on its own node (armOwn), all in one round trip:
// a data watch on p, which p's grant or renewal fires, and a child watch
// on p, which only p's deletion fires. When both are armed and p is a
// waiting place that is never kept, p's grant makes pl next without a
// read, and the child watch reports p's deletion after the grant spent the
// data watch (pl.noKeep); otherwise the data watch alone follows p, and pl
// reads p at its grant (see behindGranted). It reports whether pl's own
// node is watched: false when it is gone or the store failed.
//
// When the data watch could not be armed (p is gone, or the store failed)
// pl is evaluated again, once. When only the child watch could not (p was
// deleted between the two requests, say), the data watch, armed while p
// stood, reports p's change or deletion: a second evaluation would tell
// pl's turn a second time.
func (b *Backend) armPred(ctx context.Context, pl *place, p string) bool {
	own, deletion := make(chan bool, 1), make(chan bool, 1)
	go func() { own <- b.armOwn(ctx, pl) }()
	go func() { ok, _ := b.tryArm(ctx, pl, p, false); deletion <- ok }()
	data, neverKept := b.tryArm(ctx, pl, p, true)
	del := <-deletion
	b.mu.Lock()
	b.setNoKeepLocked(pl, "")
	if data && del && neverKept {
		b.setNoKeepLocked(pl, p)
	}
	b.mu.Unlock()
	ok := <-own
	if ok && !data {
		// (When pl's own node is not watched, its caller tells the turn.)
		b.spawn(func() { b.evaluate(pl, nil) })
	}
	return ok
}

// armOwn makes sure a data watch on pl's own node is armed (pl.own), which
// its change or deletion fires, and reports whether the node exists and
// the watch is armed. (A data watch, not an exists watch: on a node
// already gone, an exists watch would wait for its creation, which never
// comes for a sequential node, and stay registered until the session
// ends; getData sets no watch on a missing node.)
func (b *Backend) armOwn(ctx context.Context, pl *place) bool {
	b.mu.Lock()
	armed := pl.own != nil
	b.mu.Unlock()
	if armed {
		return true
	}
	var (
		st  *zk.Stat
		ch  <-chan zk.Event
		err error
	)
	if b.armHook != nil {
		defer b.armHook(pl.path, true)()
	}
	if cerr := b.call(ctx, func() { _, st, ch, err = b.conn.GetW(pl.path) }, nil); cerr != nil || err != nil {
		return false
	}
	b.mu.Lock()
	pl.own = ch
	if pl.token == 0 && pl.version >= 0 {
		pl.token = uint64(st.Czxid) // a place made by enqueue
	}
	b.mu.Unlock()
	return true
}

// followPlace waits for the watch ch on p, armed for pl under id, and acts
// on its event, unless onEvent acted on it already.
func (b *Backend) followPlace(pl *place, p, id string, data bool, ch <-chan zk.Event) {
	var ev zk.Event
	select {
	case ev = <-ch:
	case <-pl.stop:
		return
	case <-b.done:
		return
	}
	b.mu.Lock()
	delete(pl.armed, id)
	// onEvent may have acted on the event already: on the grant of a
	// place never kept, or on its deletion (pl.gone).
	handled := data && ev.Type == zk.EventNodeDataChanged && pl.granted == p
	if handled {
		pl.granted = ""
	}
	// The deletion of the node before a mutex's place is its data watch's
	// to report (see armPred), unless the data watch was spent on the
	// grant of a place never kept; and both may report it.
	ignore := !data && pl.limit <= 1 && !isHold(p) && !(pl.aloneOn == p && pl.noKeep == p)
	if !ignore && ev.Type == zk.EventNodeDeleted {
		ignore = pl.gone == p
		pl.gone = p
	}
	b.mu.Unlock()
	if handled && b.watchHook != nil {
		b.watchHook(p)()
	}
	if handled || ignore {
		return
	}
	if b.watchHook != nil {
		defer b.watchHook(p)()
	}
	b.mu.Lock()
	if data && ev.Type == zk.EventNodeDataChanged && b.nextToGrantLocked(pl, p) {
		b.mu.Unlock()
		return
	}
	pl.settled = false
	// Only the deletion of the one node before it (as the latest
	// judgement found) makes the turn certain: a watch armed by an
	// earlier judgement, on a node that was then one of several
	// before it, may fire after a later one found a single node left,
	// which still holds. The child watch on that node tells of its
	// deletion only when it is never kept (its data watch may be spent
	// on its grant): the data watch tells of a keep first.
	fast := pl.aloneOn == p && ev.Type == zk.EventNodeDeleted && pl.own != nil && (data || pl.noKeep == p)
	if fast {
		select {
		case <-pl.own:
			// The place's own node changed or went before the node
			// before it did: the children tell.
			pl.own, fast = nil, false
		default:
		}
	}
	pl.fast = fast
	b.mu.Unlock()
	if fast {
		// The one node before it is gone, no other can come before it,
		// and its own node is still there (its watch has not fired, and
		// the server sends the events of one session's watches in the
		// order of the changes): its turn, and its grant needs no read of
		// the children. (A hold comes only from that node, in the same
		// multi as its deletion and after a write to it, which this
		// watch reports instead: a data change, read again below.)
		b.tellTurn(pl)
		return
	}
	if data && ev.Type == zk.EventNodeDataChanged && b.behindGranted(pl, p, id) {
		return
	}
	b.evaluate(pl, nil)
}

// nextToGrantLocked acts on a data change of p, the node just before the
// mutex place pl, when p was a waiting place that is never kept as the
// watches on it were armed (pl.noKeep), and the child watch on it still is.
// A waiting place's data changes only at its grant: p holds, so it is the
// only node before pl, and its deletion, which the child watch on it
// reports, leaves no hold behind. pl is then next without a read; the
// holder is read at its waiter's next attempt. It reports whether pl is;
// not when pl's own node changed or went first (pl.own fired), which the
// children tell.
func (b *Backend) nextToGrantLocked(pl *place, p string) bool {
	if pl.noKeep != p || pl.limit > 1 || pl.own == nil || !pl.armed[p] {
		return false
	}
	select {
	case <-pl.own:
		pl.own = nil
		return false
	default:
	}
	pl.aloneOn, pl.info, pl.infoEnd, pl.unread = p, nil, time.Time{}, true
	return true
}

// setNoKeepLocked sets pl.noKeep to p ("": none) and keeps b.noKeepOn,
// by which onEvent finds pl, in step.
func (b *Backend) setNoKeepLocked(pl *place, p string) {
	if pl.noKeep != "" && b.noKeepOn[pl.noKeep] == pl {
		delete(b.noKeepOn, pl.noKeep)
	}
	pl.noKeep = p
	if p != "" {
		b.noKeepOn[p] = pl
	}
}

// onEvent is the session's event callback: go-zookeeper calls it on its
// receive loop with each event, in the server's order, before the
// watches' channels get it. For a mutex's place whose node before it is a
// waiting place that is never kept (pl.noKeep), it acts on that node's
// events as they arrive, as followPlace would without a read: its grant
// makes the place next (nextToGrantLocked), and its deletion then is the
// place's turn, told here, when no event of the place's own node came
// first. That spares a hand-off the wake of followPlace's goroutines, and
// the events' order is the server's: a grant rewritten just before its
// release is still seen first. followPlace then finds the events handled
// (pl.granted, pl.gone) and drops them; it acts on every other event. (A
// Backend on a caller's connection has no callback: followPlace acts on
// every event.)
//
// It must not block: the session's replies wait behind it. It takes b.mu,
// which is never held across a store call, and the subscribers' turn
// functions run here as they do on followPlace's goroutine.
func (b *Backend) onEvent(ev zk.Event) {
	if ev.Type != zk.EventNodeDataChanged && ev.Type != zk.EventNodeDeleted {
		return
	}
	p := ev.Path
	b.mu.Lock()
	pl := b.noKeepOn[p]
	if pl == nil {
		b.mu.Unlock()
		return
	}
	select {
	case <-pl.stop:
		b.mu.Unlock()
		return
	default:
	}
	if ev.Type == zk.EventNodeDataChanged {
		// (The data watch on p is spent by this event: none other
		// follows it.)
		if pl.armed[p+"\x00d"] && b.nextToGrantLocked(pl, p) {
			pl.granted = p
		}
		b.mu.Unlock()
		return
	}
	delete(b.noKeepOn, p) // (a sequential node's name is never used again)
	turn := pl.limit <= 1 && pl.noKeep == p && pl.aloneOn == p && pl.gone != p && pl.armed[p] && pl.own != nil
	if turn {
		select {
		case <-pl.own:
			// Its own node changed or went first: the children tell.
			pl.own, turn = nil, false
		default:
		}
	}
	if turn {
		pl.gone, pl.settled, pl.fast = p, false, true
	}
	b.mu.Unlock()
	if turn {
		b.tellTurn(pl)
	}
}

// behindGranted handles a data change of p, the node just before the mutex
// place pl, when p may be kept or was not a waiting place as its watch was
// armed (see armPred for one that is never kept). When p now has a
// mutex claim's data it was granted, or renewed: it is the lowest node in
// force, and so the only one before pl (no node can come between them, and
// a hold comes only from p, with p's deletion). That is what evaluate would
// find in the children; here the one read that tells it (GetW) also
// watches p again, and gives the holder's expiry, at which pl's waiter
// polls; the watch on pl's own node (see place.own) is armed in the same
// round trip when it is not armed yet. It reports false when p is gone or has other data (a claim
// rewritten as a waiting place, say): evaluate then reads the children.
func (b *Backend) behindGranted(pl *place, p, id string) bool {
	if c, ok := parseChild(path.Base(p)); !ok || c.hold || c.limit > 0 || pl.limit > 1 {
		return false
	}
	pl.evalMu.Lock()
	defer pl.evalMu.Unlock()
	select {
	case <-pl.stop:
		return true
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var (
		data []byte
		st   *zk.Stat
		ch   <-chan zk.Event
		err  error
	)
	own := make(chan bool, 1)
	go func() { own <- b.armOwn(ctx, pl) }() // in the same round trip
	cerr := b.call(ctx, func() { data, st, ch, err = b.conn.GetW(p) }, nil)
	if !<-own || cerr != nil || err != nil {
		return false
	}
	ttl, owner, perr := parseData(data)
	if perr != nil {
		return false
	}
	exp := st.Mtime + ttl
	left := time.Duration(exp-b.serverNow()) * time.Millisecond
	info := &core.Info{Key: pl.key, Owner: owner, Token: ClaimToken(data, st), AcquiredAt: msTime(st.Ctime), ExpiresAt: msTime(exp)}
	b.mu.Lock()
	pl.aloneOn = p
	pl.info, pl.infoEnd, pl.unread = info, time.Now().Add(left), false
	armed := pl.armed[id]
	pl.armed[id] = true
	pl.settled = true
	b.mu.Unlock()
	if !armed {
		b.spawn(func() { b.followPlace(pl, p, id, true, ch) })
	}
	return true
}

// tellTurn tells the subscribers (WatchTurns) that it is pl's waiter's
// turn, unless pl has ended, or pl is a mutex's place whose waiter was told
// already and has not tried since: once first, a mutex's place stays first
// until its waiter tries, so two reports of one change (a watch that fired
// and a judgement under way when it did, say) are one turn. (A semaphore's
// first waiter is told once per permit freed, see core.Queuer.)
func (b *Backend) tellTurn(pl *place) {
	b.mu.Lock()
	pl.settled = false
	select {
	case <-pl.stop:
		// Granted, left or expired meanwhile (an evaluation under way
		// as its waiter's attempt took it): no turn is its.
		b.mu.Unlock()
		return
	default:
	}
	if pl.told && pl.limit <= 1 {
		b.mu.Unlock()
		return
	}
	pl.told = true
	fns := make([]func(string, string), 0, len(b.turnSubs))
	for _, fn := range b.turnSubs {
		fns = append(fns, fn)
	}
	b.mu.Unlock()
	for _, fn := range fns {
		fn(pl.key, pl.waiter)
	}
}

// WatchTurns implements core.Queuer: fn is told the turns of this
// backend's own waiters (a ZooKeeper waiter watches the node before its
// own; no other process hears of its turn). ready is called at once.
func (b *Backend) WatchTurns(ctx context.Context, ready func(), fn func(key, waiter string)) error {
	return b.subscribed(ctx, ready, func(id int) { b.turnSubs[id] = fn }, func(id int) { delete(b.turnSubs, id) })
}

// Leave implements core.Queuer: it deletes waiter's place in key's line,
// which tells the waiter behind it.
func (b *Backend) Leave(ctx context.Context, key, waiter string) error {
	if err := core.ValidateKey(key); err != nil {
		return err
	}
	pk := placeKey(key, waiter)
	b.mu.Lock()
	pl := b.places[pk]
	b.mu.Unlock()
	if pl == nil {
		return nil
	}
	return b.leavePlace(ctx, pk, pl)
}

// leaveAll deletes every place of this backend (Close of a backend on the
// caller's connection, whose session outlives it).
func (b *Backend) leaveAll() {
	b.mu.Lock()
	var list []*place
	for pk, pl := range b.places {
		list = append(list, pl)
		b.dropPlaceLocked(pk, pl)
	}
	b.mu.Unlock()
	if len(list) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, pl := range list {
		if pl.path != "" {
			b.del(ctx, pl.path, -1)
		}
	}
}

// sampleClock records the server time ms of a write just answered: the
// server's clock minus the local one, as of the reply (never ahead of the
// server).
func (b *Backend) sampleClock(ms int64) {
	b.skewMs.Store(ms - time.Now().UnixMilli())
	b.skewSet.Store(true)
}

// serverNow estimates the server's clock from the last write's reply; it
// errs towards the past, so that nothing is judged expired early.
func (b *Backend) serverNow() int64 {
	if !b.skewSet.Load() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if t, err := b.Now(ctx, ""); err == nil {
			return t.UnixMilli()
		}
	}
	return time.Now().UnixMilli() + b.skewMs.Load()
}
