package zklock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dislock/dislock/core"
)

// renewChunk is the most leases one renew multi carries.
const renewChunk = 256

// Renew implements core.Backend. All leases go into one multi of setData
// operations on their claim nodes (split every 256): a quorum write, which
// the leader applies only while the session is alive, and which stamps each
// claim with the server time of the renewal (its mtime). A lease whose claim
// is gone fails the multi at its index; it is reported lost and the multi is
// sent again without it. A lease whose claim was made in an earlier session
// is lost: go-zookeeper opens a new session silently after an expiry.
func (b *Backend) Renew(ctx context.Context, reqs []core.RenewRequest) ([]error, error) {
	results := make([]error, len(reqs))
	sid := b.conn.SessionID()
	type item struct {
		i    int
		path string
		data []byte
	}
	var items []item
	b.mu.Lock()
	for i, r := range reqs {
		c := b.claims[r.OwnerToken]
		switch {
		case c == nil || c.key != r.Key || c.path == "":
			results[i] = core.Gone(r.Key, "no claim node of this owner")
		case c.sid != sid || sid == 0:
			delete(b.claims, r.OwnerToken)
			results[i] = core.Gone(r.Key, "the ZooKeeper session that held it ended")
		default:
			data := claimData(r.TTL, c.owner)
			if c.tokenData {
				data = tokenData(r.TTL, c.token, c.owner)
			}
			items = append(items, item{i, c.path, data})
		}
	}
	b.mu.Unlock()

	start := time.Now()
	gone := func(it item, why string) {
		results[it.i] = core.Gone(reqs[it.i].Key, why)
		b.forget(reqs[it.i].OwnerToken)
		b.unmarkHeld(reqs[it.i].Key, reqs[it.i].OwnerToken)
	}
	var firstErr error
	unknown := 0
	for start := 0; start < len(items); start += renewChunk {
		pending := items[start:min(start+renewChunk, len(items))]
		for len(pending) > 0 {
			ops := make([]any, len(pending))
			for j, it := range pending {
				ops[j] = &zk.SetDataRequest{Path: it.path, Data: it.data, Version: -1}
			}
			var got, res []zk.MultiResponse
			var merr error
			err := b.call(ctx, func() { got, merr = b.conn.Multi(ops...) }, nil)
			if err == nil {
				res, err = got, merr
			}
			if err == nil && b.conn.SessionID() != sid {
				err = zk.ErrSessionExpired
			}
			if err == nil {
				break
			}
			if errors.Is(err, zk.ErrSessionExpired) {
				for _, it := range pending {
					gone(it, "the ZooKeeper session expired")
				}
				break
			}
			bad := -1
			if len(res) == len(pending) {
				for j, r := range res {
					if errors.Is(r.Error, zk.ErrNoNode) || errors.Is(r.Error, zk.ErrBadVersion) {
						bad = j
						break
					}
				}
			}
			if bad < 0 {
				err = fmt.Errorf("zklock: renew: %w", err)
				if firstErr == nil {
					firstErr = err
				}
				for _, it := range pending {
					results[it.i] = err
					unknown++
				}
				break
			}
			gone(pending[bad], "its claim node is gone")
			pending = append(pending[:bad:bad], pending[bad+1:]...)
		}
	}
	b.mu.Lock()
	for i, r := range reqs {
		if results[i] == nil {
			if h := b.held[r.Key]; h != nil && h.ownerToken == r.OwnerToken {
				h.until = start.Add(r.TTL)
			}
		} else if errors.Is(results[i], core.ErrLeaseLost) {
			b.unmarkHeldLocked(r.Key, r.OwnerToken)
		}
	}
	b.mu.Unlock()
	if unknown == len(reqs) && firstErr != nil {
		return nil, firstErr
	}
	return results, nil
}
