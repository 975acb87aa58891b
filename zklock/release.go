package zklock

import (
	"context"
	"errors"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dislock/dislock/core"
)

// Release implements core.Backend. It deletes the claim by its unique path,
// so a stale release never touches another holder's node. With Keep > 0 one
// multi replaces the claim by a hold that lasts until the claim's
// acquisition (server time) plus the time held plus Keep. A claim that is
// gone already (force-released, or deleted as expired by a later claimer)
// is answered core.Gone.
func (b *Backend) Release(ctx context.Context, req core.ReleaseRequest) error {
	// Until the release is done, the lock reads as busy here without a
	// request.
	defer b.unmarkHeld(req.Key, req.OwnerToken)
	b.mu.Lock()
	c := b.claims[req.OwnerToken]
	if c != nil && c.key != req.Key {
		c = nil
	}
	var cc claim
	if c != nil {
		cc = *c
	}
	b.mu.Unlock()
	if c == nil {
		return b.releaseByToken(ctx, req)
	}
	var err error
	switch {
	case cc.path == "": // a slot's hold
		err = b.del(ctx, cc.hold, -1)
	case req.Keep > 0:
		until := cc.acqMs + (time.Since(cc.acqLocal) + req.Keep).Milliseconds()
		err = b.keep(ctx, req.Key, cc.path, until, cc.token, cc.owner, encodeName(req.OwnerToken), cc.limit)
	default:
		err = b.delClaim(ctx, req.Key, cc.path)
		if err == nil {
			b.echo(req.Key, cc.path)
		}
	}
	if err != nil && !errors.Is(err, core.ErrLeaseGone) {
		return err
	}
	b.forget(req.OwnerToken)
	return err
}

// delClaim deletes the claim of key at p; core.Gone when it is gone
// already.
func (b *Backend) delClaim(ctx context.Context, key, p string) error {
	var err error
	if cerr := b.call(ctx, func() { err = b.conn.Delete(p, -1) }, nil); cerr != nil {
		return cerr
	}
	if errors.Is(err, zk.ErrNoNode) {
		return core.Gone(key, "claim deleted")
	}
	return err
}

// keep replaces the claim at p by a hold until the server time until.
func (b *Backend) keep(ctx context.Context, key, p string, until int64, token uint64, owner, encToken string, limit int) error {
	hold := b.keyPath(key) + "/" + holdName(until, encToken, limit)
	var err error
	if cerr := b.call(ctx, func() {
		_, err = b.conn.Multi(
			&zk.CreateRequest{Path: hold, Data: holdData(token, owner), Acl: b.acl, Flags: zk.FlagPersistent},
			// A write to the claim before its deletion: the waiter
			// behind it hears of a data change, not of a deletion, and
			// reads the children, where it finds the hold.
			&zk.SetDataRequest{Path: p, Version: -1},
			&zk.DeleteRequest{Path: p, Version: -1},
		)
	}, nil); cerr != nil {
		return cerr
	}
	switch {
	case err == nil || errors.Is(err, zk.ErrNodeExists):
		// NodeExists: an earlier try applied.
		return nil
	case errors.Is(err, zk.ErrNoNode):
		// The hold could be created (no earlier try applied), but the
		// claim is gone.
		return core.Gone(key, "claim deleted")
	}
	return err
}

// releaseByToken releases a lock this backend has no record of (another
// process's session, or an acquire whose reply was lost): it looks for the
// owner token among the key's children.
func (b *Backend) releaseByToken(ctx context.Context, req core.ReleaseRequest) error {
	if err := core.ValidateKey(req.Key); err != nil {
		return err
	}
	parent := b.keyPath(req.Key)
	tok := encodeName(req.OwnerToken)
	var names []string
	var err error
	// Sync first: after a reconnect the server answering may not have
	// applied the claim being undone yet.
	if cerr := b.call(ctx, func() {
		if _, err = b.conn.Sync(parent); err == nil || errors.Is(err, zk.ErrNoNode) {
			names, _, err = b.conn.Children(parent)
		}
	}, nil); cerr != nil {
		return cerr
	}
	if errors.Is(err, zk.ErrNoNode) {
		return core.Gone(req.Key, "held by another owner or gone")
	}
	if err != nil {
		return err
	}
	var errs []error
	found := false // a claim or hold of this owner token was released or kept
	for _, n := range names {
		c, ok := parseChild(n)
		if !ok || c.token != tok {
			continue
		}
		p := parent + "/" + n
		if req.Keep > 0 && !c.hold {
			data, st, gerr := b.get(ctx, p)
			if errors.Is(gerr, zk.ErrNoNode) {
				continue
			}
			if gerr != nil {
				errs = append(errs, gerr)
				continue
			}
			_, owner, _ := parseData(data)
			now, err := b.Now(ctx, req.Key)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if err := b.keep(ctx, req.Key, p, now.Add(req.Keep).UnixMilli(), ClaimToken(data, st), owner, tok, c.limit); !errors.Is(err, core.ErrLeaseGone) {
				errs = append(errs, err)
				found = found || err == nil
			}
			continue
		}
		err := b.delClaim(ctx, req.Key, p)
		if err == nil && !c.hold {
			b.echo(req.Key, p)
		}
		if !errors.Is(err, core.ErrLeaseGone) {
			errs = append(errs, err)
			found = found || err == nil
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if !found {
		return core.Gone(req.Key, "held by another owner or gone")
	}
	return nil
}
