package zklock_test

import (
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/benchtest"
	"github.com/dislock/dislock/zklock"
)

// The rules of semaphores are core/locktest's Semaphore rules, which
// TestConformance and TestConformanceEnsemble run; here is what is
// ZooKeeper's own: the nodes a claim leaves and the requests a renewal
// costs.

func permitReq(key string, limit int, ttl time.Duration) core.AcquireRequest {
	return core.AcquireRequest{Key: key, Owner: "test", OwnerToken: rand.Text(), TTL: ttl, Limit: limit}
}

// TestSemMismatchLeavesNoNode: a claim whose limit differs from the
// holders' (from the holder's own session too) leaves no claim node
// behind, not even one that Holders would skip.
func TestSemMismatchLeavesNoNode(t *testing.T) {
	connect, root := singleConnect(t), testRoot()
	bs := make([]*zklock.Backend, 2)
	for i := range bs {
		bs[i] = newBackend(t, connect, root, zklock.WithSessionTimeout(30*time.Second))
	}
	ctx := ctxT(t, 60*time.Second)
	if _, err := bs[0].TryAcquire(ctx, core.AcquireRequest{Key: "m", OwnerToken: "mutex", TTL: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, err := bs[0].TryAcquire(ctx, permitReq("s", 2, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	for _, b := range bs {
		for _, r := range []core.AcquireRequest{
			permitReq("m", 2, 5*time.Second),
			{Key: "s", OwnerToken: "mutex", TTL: 5 * time.Second},
			permitReq("s", 3, 5*time.Second),
		} {
			if _, err := b.TryAcquire(ctx, r); !errors.Is(err, core.ErrLimitMismatch) {
				t.Fatalf("%s with Limit %d: got %v, want ErrLimitMismatch", r.Key, r.Limit, err)
			}
		}
	}
	conn := rawConn(t, connect)
	for _, key := range []string{"m", "s"} {
		names, _, err := conn.Children(bs[1].KeyPath(key))
		if err != nil || len(names) != 1 {
			t.Fatalf("%s: children %v, %v: a mismatch must leave no claim", key, names, err)
		}
	}
}

// TestSemRenewBatch: one Renew call renews mutex leases and permits of
// several semaphores in one multi.
func TestSemRenewBatch(t *testing.T) {
	connect := singleConnect(t)
	var cnt counter
	b := newBackend(t, connect, testRoot(), zklock.WithSessionTimeout(30*time.Second), zklock.WithDialer(cnt.dial))
	ctx := ctxT(t, 60*time.Second)
	// A TTL the 40 claims cannot outlast on a busy machine: the first
	// leases are still held when the renewal is counted.
	const ttl = 15 * time.Second
	reqs := benchtest.MixedClaims(t, ctx, b, ttl)
	n0 := cnt.n.Load()
	benchtest.RenewAll(t, ctx, b, reqs)
	if n := cnt.n.Load() - n0; n != 1 {
		t.Fatalf("renewal of %d leases: %d requests, want 1", len(reqs), n)
	}
}
