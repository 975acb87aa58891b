package etcdlock

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dislock/dislock/core"
)

var _ core.Queuer = (*Backend)(nil)

// queueMark starts, after the prefix, the etcd keys of waiter queues:
// <prefix> NUL "q" NUL <key> NUL <waiter>. No lock key starts with NUL,
// so no lock or permit key is a waiter key.
const queueMark = "\x00q\x00"

// queueRange is the etcd key range [lo, hi) of key's waiters.
func (b *Backend) queueRange(key string) (lo, hi string) {
	p := b.prefix + queueMark + key
	return p + "\x00", p + "\x01"
}

func (b *Backend) waiterKey(key, waiter string) string {
	lo, _ := b.queueRange(key)
	return lo + waiter
}

// queueKey parses a waiter key.
func (b *Backend) queueKey(ekey string) (key, waiter string, ok bool) {
	rest, ok := strings.CutPrefix(ekey, b.prefix+queueMark)
	if !ok {
		return "", "", false
	}
	key, waiter, ok = strings.Cut(rest, "\x00")
	return key, waiter, ok
}

// wait is what a claim knows of its waiter's place in line.
type wait struct {
	rev int64 // its waiter key's create revision; 0 when not known
}

// ownPlace is one of this backend's own waiters in a queue.
type ownPlace struct {
	token string    // the owner token of its attempts
	rev   int64     // its waiter key's create revision; 0 when not known
	until time.Time // local: when its place runs out unless another attempt comes
	timer *time.Timer
}

// ownWait returns what this backend knows of waiter's place on key.
func (b *Backend) ownWait(key, waiter string) wait {
	b.mu.Lock()
	defer b.mu.Unlock()
	if p := b.waits[key][waiter]; p != nil {
		return wait{rev: p.rev}
	}
	return wait{}
}

// placeLocked returns the record of waiter's place on key, made when
// missing.
func (b *Backend) placeLocked(key, waiter string) *ownPlace {
	m := b.waits[key]
	if m == nil {
		m = make(map[string]*ownPlace)
		b.waits[key] = m
	}
	p := m[waiter]
	if p == nil {
		p = &ownPlace{}
		m[waiter] = p
	}
	return p
}

func (b *Backend) setWait(key, waiter string, w wait) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.placeLocked(key, waiter).rev = w.rev
}

// keepWait notes an attempt of waiter on key: its place lasts until until.
// The waiter keys of all this backend's waiters of one WaiterTTL share a
// lease, which any of their attempts refresh; so a waiter that stops trying
// without a Leave (a Leave lost in an outage, a process that stopped
// calling) has its key deleted by this backend once until has passed,
// rather than kept in line by the others' attempts.
func (b *Backend) keepWait(key, waiter, token string, until time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.placeLocked(key, waiter)
	p.token = token
	if !until.After(p.until) {
		return
	}
	p.until = until
	if p.timer == nil {
		p.timer = time.AfterFunc(time.Until(until), func() { b.expireWait(key, waiter, p) })
	} else {
		p.timer.Reset(time.Until(until))
	}
}

// expireWait ends the place p of waiter on key when its time has run out
// without another attempt: its waiter key is deleted.
func (b *Backend) expireWait(key, waiter string, p *ownPlace) {
	b.mu.Lock()
	if b.waits[key][waiter] != p {
		b.mu.Unlock()
		return
	}
	if left := time.Until(p.until); left > 0 {
		p.timer.Reset(left)
		b.mu.Unlock()
		return
	}
	rev := p.rev
	b.dropWaitLocked(key, waiter)
	b.mu.Unlock()
	b.deleteWaiter(key, waiter, rev)
}

// deleteWaiter deletes the waiter key of waiter on key, in the background,
// retrying until it is deleted or the backend closes (Close revokes the
// lease it is bound to). With rev, only the place of that create revision
// is deleted: a later attempt of the same waiter has queued it again.
func (b *Backend) deleteWaiter(key, waiter string, rev int64) {
	b.bgMu.Lock()
	defer b.bgMu.Unlock()
	if b.closed {
		return
	}
	wkey := b.waiterKey(key, waiter)
	b.bg.Go(func() {
		for pause := 50 * time.Millisecond; ; pause = min(2*pause, 2*time.Second) {
			ctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(b.stopCtx), 5*time.Second)
			var err error
			if rev != 0 {
				_, err = b.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(wkey), "=", rev)).Then(clientv3.OpDelete(wkey)).Commit()
			} else {
				_, err = b.cli.Delete(ctx, wkey)
			}
			cancel()
			if err == nil {
				return
			}
			select {
			case <-b.stopCtx.Done():
				return
			case <-time.After(pause):
			}
		}
	})
}

func (b *Backend) dropWait(key, waiter string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dropWaitLocked(key, waiter)
}

func (b *Backend) dropWaitLocked(key, waiter string) {
	wk := b.waiterKey(key, waiter)
	delete(b.told, wk)
	if kv := b.grants[wk]; kv != nil {
		// Granted to a waiter that no longer waits, unless its claim read
		// the grant as its own and holds it (succeed keeps it first).
		delete(b.grants, wk)
		var token string
		if p := b.waits[key][waiter]; p != nil {
			token = p.token
		}
		if h, ok := b.held[token]; !ok || h.rev != kv.ModRevision {
			b.dropGrant(kv)
		}
	}
	if p := b.waits[key][waiter]; p != nil && p.timer != nil {
		p.timer.Stop()
	}
	delete(b.waits[key], waiter)
	if len(b.waits[key]) == 0 {
		delete(b.waits, key)
	}
}

// setTold notes that waiter, if it is this backend's, was told its turn:
// its next attempt claims without reading first.
func (b *Backend) setTold(key, waiter string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.waits[key][waiter]; ok {
		b.told[b.waiterKey(key, waiter)] = struct{}{}
	}
}

// takeTold reports whether the waiter of wkey was told its turn since its
// last attempt, and forgets it.
func (b *Backend) takeTold(wkey string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.told[wkey]
	delete(b.told, wkey)
	return ok
}

// waiterLease is a lease waiter keys are bound to, and the send time of
// its last grant or keepalive.
type waiterLease struct {
	id        int64
	refreshed time.Time
}

// waiterLease returns the lease this backend binds waiter keys of a
// WaiterTTL of seconds to: one lease per TTL, of seconds plus one, kept
// alive by the attempts of its waiters, so that a waiter that stops trying
// (or a process that dies) leaves the queue when its lease runs out. A
// lease refreshed less than a second ago still keeps a place for the
// WaiterTTL from now; an older one is refreshed first. fresh says the
// lease was granted now: waiter keys bound to an earlier one are gone.
func (b *Backend) waiterLease(ctx context.Context, seconds int64) (id int64, fresh bool, err error) {
	b.mu.Lock()
	wl := b.wleases[seconds]
	b.mu.Unlock()
	if wl.id != 0 {
		if time.Since(wl.refreshed) < time.Second {
			return wl.id, false, nil
		}
		sent := time.Now()
		ttls, err := b.ka.keepAlive(ctx, []int64{wl.id}, false)
		if err != nil {
			return 0, false, err
		}
		if ttls[0] > 0 {
			b.mu.Lock()
			if cur := b.wleases[seconds]; cur.id == wl.id && cur.refreshed.Before(sent) {
				b.wleases[seconds] = waiterLease{id: wl.id, refreshed: sent}
			}
			b.mu.Unlock()
			return wl.id, false, nil
		}
	}
	sent := time.Now()
	resp, err := b.cli.Grant(ctx, seconds+1)
	if err != nil {
		return 0, false, err
	}
	b.mu.Lock()
	b.wleases[seconds] = waiterLease{id: int64(resp.ID), refreshed: sent}
	b.mu.Unlock()
	return int64(resp.ID), true, nil
}

// queueView is what a claim read of key's queue: how many live waiters
// are before the claim's waiter (all of them for a claim without one).
type queueView struct {
	rev    int64 // the store revision of the read
	before int
}

// queueCmp is the part of a claim's guard that checks the queue: for a
// waiter whose place is known, that its key is still there and, when
// first is set, that no waiter key is older; for any other claim, that no
// waiter key was created after the read at rev (or, with rev 0, that there
// is none).
func (c *claim) queueCmp(first bool, rev int64) []*etcdserverpb.Compare {
	lo, hi := c.keys.qlo, c.keys.qhi
	if c.wait.rev != 0 {
		cmps := []*etcdserverpb.Compare{compare(etcdserverpb.Compare_CREATE, []byte(c.wkey), nil, etcdserverpb.Compare_EQUAL, c.wait.rev)}
		if first {
			cmps = append(cmps, compare(etcdserverpb.Compare_CREATE, lo, hi, etcdserverpb.Compare_GREATER, c.wait.rev-1))
		}
		return cmps
	}
	if rev == 0 {
		return []*etcdserverpb.Compare{compare(etcdserverpb.Compare_CREATE, lo, hi, etcdserverpb.Compare_EQUAL, 0)}
	}
	return []*etcdserverpb.Compare{compare(etcdserverpb.Compare_CREATE, lo, hi, etcdserverpb.Compare_LESS, rev+1)}
}

// queueThen is what a granted claim also does: take its waiter out of line.
func (c *claim) queueThen() []*etcdserverpb.RequestOp {
	if c.wkey == "" {
		return nil
	}
	return []*etcdserverpb.RequestOp{opDelete([]byte(c.wkey))}
}

// queueElse is what a claim that is not granted also does: queue its
// waiter at the tail unless it has a place, and read the queue. The
// responses start at index base.
func (c *claim) queueElse() []*etcdserverpb.RequestOp {
	ops := []*etcdserverpb.RequestOp{opGet(c.keys.qlo, c.keys.qhi, true)}
	if c.wkey != "" {
		wkey := []byte(c.wkey)
		ops = append(ops, opTxn([]*etcdserverpb.Compare{compare(etcdserverpb.Compare_CREATE, wkey, nil, etcdserverpb.Compare_EQUAL, 0)},
			[]*etcdserverpb.RequestOp{opPut(wkey, c.waitValue(), c.wlease)}, nil))
	}
	return ops
}

// readQueue interprets the responses of queueElse from index base: it
// records the waiter's place and returns the view.
func (c *claim) readQueue(resp *clientv3.TxnResponse, base int) queueView {
	kvs := resp.Responses[base].GetResponseRange().Kvs
	v := queueView{rev: resp.Header.Revision}
	if c.wkey == "" {
		v.before = len(kvs)
		return v
	}
	if t := resp.Responses[base+1].GetResponseTxn(); t != nil && t.Succeeded {
		// Queued now, at the tail: every waiter read is before it.
		c.wait.rev = resp.Header.Revision
		v.before = len(kvs)
	} else {
		c.wait.rev = 0
		for i, kv := range kvs {
			if string(kv.Key) == c.wkey {
				c.wait.rev = kv.CreateRevision
				v.before = i
				break
			}
		}
	}
	c.b.setWait(c.req.Key, c.req.Waiter, c.wait)
	return v
}

// startWait prepares a claim with a Waiter: its waiter key, and the lease
// that key is bound to, refreshed.
func (c *claim) startWait(ctx context.Context) (fresh bool, err error) {
	if c.req.Waiter == "" {
		return false, nil
	}
	sent := time.Now()
	seconds, err := leaseSeconds("WaiterTTL", max(c.req.WaiterTTL, time.Second))
	if err != nil {
		return false, err
	}
	id, fresh, err := c.b.waiterLease(ctx, seconds)
	if err != nil {
		return false, core.Unclaimed(fmt.Errorf("waiter lease: %w", err))
	}
	c.wkey, c.wlease = c.b.waiterKey(c.req.Key, c.req.Waiter), id
	c.b.keepWait(c.req.Key, c.req.Waiter, c.req.OwnerToken, sent.Add(max(c.req.WaiterTTL, time.Second)))
	c.wait = c.b.ownWait(c.req.Key, c.req.Waiter)
	if fresh {
		c.wait.rev = 0
	}
	return fresh, nil
}

// Leave implements core.Queuer: it deletes the waiter's key. The watchers
// of the processes with waiters behind it see the deletion and tell the
// next one when the key can be claimed.
//
// A Leave that fails goes on in the background until the waiter key is
// deleted (or the backend closes, which revokes its lease): other waiters
// of this backend keep that lease alive.
func (b *Backend) Leave(ctx context.Context, key, waiter string) error {
	b.dropWait(key, waiter)
	_, err := b.cli.Delete(clientv3.WithRequireLeader(ctx), b.waiterKey(key, waiter))
	if err != nil {
		b.deleteWaiter(key, waiter, 0)
		return fmt.Errorf("etcdlock: leave: %w", err)
	}
	return nil
}

// WatchTurns implements core.Queuer with one watch on the prefix that
// reports deletions (without their previous values, which it needs not: a
// watcher's previous value costs the server a read per event): a lock or a
// permit released, forced or expired, or a waiter that left, was granted
// or expired.
//
// The watch starts right after a read of every waiter key under the
// prefix, and follows their creations and deletions: it knows the line of
// every key, by create revision. A release (or expiry, or ForceRelease) of
// a lock whose first waiter is this backend's tells that waiter at once,
// unless the same watch response shows the key or its line changing again
// after it; a Locker whose waiters are all behind another reads and tells
// nothing. Any other deletion with this backend's waiter first — a
// permit, a waiter key (a Leave), a lock with a later change in the same
// response — is followed by a read of the key and its queue at the
// deletion's revision (tellTurns). So a hand-off of a lock costs no read,
// and no Locker with a waiter further back does anything.
func (b *Backend) WatchTurns(ctx context.Context, ready func(), fn func(key, waiter string)) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	// queued holds, by key, the waiter keys there now, with their create
	// revisions.
	queued := map[string]map[string]int64{}
	// values holds the waiter keys' values (a waiter's grant, grant.go),
	// and changed the keys whose line changed, whose first waiter is
	// recorded again (setFirst) after each watch response.
	values := map[string][]byte{}
	changed := map[string]bool{}
	add := func(ekey string, rev int64, value []byte) {
		key, _, ok := b.queueKey(ekey)
		if !ok {
			return
		}
		if queued[key] == nil {
			queued[key] = map[string]int64{}
		}
		queued[key][ekey] = rev
		values[ekey] = value
		changed[key] = true
	}
	publish := func() {
		for key := range changed {
			b.setFirst(key, queued[key], values)
		}
		clear(changed)
	}
	defer func() {
		b.mu.Lock()
		clear(b.firsts)
		b.mu.Unlock()
	}()
	snap, err := b.cli.Get(wctx, b.prefix+queueMark, clientv3.WithRange(b.prefix+queueEnd))
	if err != nil {
		return fmt.Errorf("etcdlock: watch: read the waiters: %w", err)
	}
	for _, kv := range snap.Kvs {
		add(string(kv.Key), kv.CreateRevision, kv.Value)
	}
	publish()
	return b.watchPrefix(ctx, snap.Header.Revision+1, false, ready, func(events []*mvccpb.Event) {
		// One turn per key and revision with deletions: a lock or permit
		// released, or a waiter out of line.
		type turn struct {
			key string
			rev int64
		}
		type turnInfo struct {
			lock bool // the lock key itself was deleted (not a permit, not a waiter)
			last int  // the index of the turn's last event
		}
		turns := map[turn]*turnInfo{}
		var order []turn
		heldAt := map[string]int64{} // the latest revision of this response at which a key's lock key was put
		lastEvent := map[string]int{}
		for i, ev := range events {
			ekey := string(ev.Kv.Key)
			key, _, isWaiter := b.queueKey(ekey)
			if !isWaiter {
				var ok bool
				if key, ok = b.lockKey(ekey); !ok {
					continue
				}
			}
			lastEvent[key] = i
			if ev.Type != mvccpb.DELETE {
				switch {
				case isWaiter && ev.IsCreate():
					add(ekey, ev.Kv.CreateRevision, ev.Kv.Value)
				case !isWaiter && ekey == b.etcdKey(key):
					// Claimed, or granted by a release (a put over the
					// key): held at that revision.
					heldAt[key] = max(heldAt[key], ev.Kv.ModRevision)
					if ev.IsCreate() {
						break
					}
					// A grant names its Backend (record.Grant): the value
					// is decoded only when it has this one's id.
					if !bytes.Contains(ev.Kv.Value, b.idJSON) {
						break
					}
					if rec, ok := decode(ev.Kv.Value); ok && rec.Grant == b.id {
						if w := b.granted(key, ev.Kv, rec); w != "" {
							fn(key, w)
						}
					}
				}
				continue
			}
			if isWaiter {
				if m := queued[key]; m != nil {
					delete(m, ekey)
					if len(m) == 0 {
						delete(queued, key)
					}
				}
				delete(values, ekey)
				changed[key] = true
			} else {
				b.markFree(key)
			}
			t := turn{key, ev.Kv.ModRevision}
			ti := turns[t]
			if ti == nil {
				ti = &turnInfo{}
				turns[t] = ti
				order = append(order, t)
			}
			ti.lock = ti.lock || (!isWaiter && ekey == b.etcdKey(key))
			ti.last = i
		}
		publish()
		for _, t := range order {
			if heldAt[t.key] >= t.rev {
				// Held at that revision, or again at a later one of this
				// response (the first waiter claimed it meanwhile): this
				// deletion's turn is over, and the next release tells.
				continue
			}
			ti := turns[t]
			first := b.firstOwn(t.key, queued[t.key])
			switch {
			case first == "":
				// Nobody in line, or another backend's waiter first: its
				// own Locker tells it.
			case ti.lock && lastEvent[t.key] == ti.last:
				// The lock is free since this deletion and nothing of the
				// key changed after it: the first waiter, this backend's,
				// may claim.
				b.setTold(t.key, first)
				fn(t.key, first)
			default:
				b.tellTurns(wctx, t.key, t.rev, fn)
			}
		}
	})
}

// firstIn returns the waiter key of line (waiter keys by create revision)
// with the lowest create revision, and that revision; "" when line is
// empty.
func firstIn(line map[string]int64) (ekey string, rev int64) {
	for k, r := range line {
		if ekey == "" || r < rev {
			ekey, rev = k, r
		}
	}
	return ekey, rev
}

// queueEnd ends the etcd key range of every waiter key under the prefix:
// [prefix+queueMark, prefix+queueEnd).
const queueEnd = "\x00q\x01"

// firstOwn returns the first waiter in key's line, queued (the waiter keys
// there now), when it is this backend's, and "" otherwise. The line the
// watch follows is complete: a waiter of this backend whose key is not in
// it yet is queued after the deletion being handled, and its own attempt
// sees the key as it is then.
func (b *Backend) firstOwn(key string, queued map[string]int64) string {
	firstKey, _ := firstIn(queued)
	if firstKey == "" {
		return ""
	}
	_, w, ok := b.queueKey(firstKey)
	if !ok {
		return ""
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.waits[key][w] == nil {
		return ""
	}
	return w
}

// tellTurns reads key and its queue as they were at revision rev, just
// after the deletion seen, and when a permit was free then (the lock was
// free), tells the first waiter in line (fn is told another process's
// waiter too, which the engine ignores). A grant that leaves a permit free
// deletes its waiter's key, which tells the next one. (Read at the
// deletion's revision, each deletion tells what it changed, and not what
// later ones did: those tell for themselves.)
//
// The deletion of a key whose lease expired tells the first waiter too,
// as the Queuer contract allows: the key is free, and the waiter need not
// wait for its poll at the holder's expiry.
func (b *Backend) tellTurns(ctx context.Context, key string, rev int64, fn func(key, waiter string)) {
	k := b.etcdKey(key)
	plo, phi := b.permitRange(key)
	qlo, qhi := b.queueRange(key)
	resp, err := b.cli.Txn(ctx).Then(clientv3.OpGet(k, clientv3.WithRev(rev)),
		clientv3.OpGet(plo, clientv3.WithRange(phi), clientv3.WithRev(rev)),
		clientv3.OpGet(qlo, clientv3.WithRange(qhi), clientv3.WithKeysOnly(), clientv3.WithRev(rev), clientv3.WithLimit(1),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))).Commit()
	if err != nil {
		return // the waiters poll
	}
	now := time.Now()
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		if rec, ok := decode(kvs[0].Value); !ok || !rec.slotOver(now) {
			return // held
		}
	}
	if live, _ := splitPermits(resp.Responses[1].GetResponseRange().Kvs, now); len(live) > 0 && len(live) >= live[0].limit() {
		return // full
	}
	if kvs := resp.Responses[2].GetResponseRange().Kvs; len(kvs) > 0 {
		if _, w, ok := b.queueKey(string(kvs[0].Key)); ok {
			b.setTold(key, w)
			fn(key, w)
		}
	}
}
