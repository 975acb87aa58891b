package etcdtest_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/etcdlock"
	"github.com/dislock/dislock/etcdlock/etcdtest"
	"github.com/dislock/dislock/etcdlock/internal/state"
	"github.com/dislock/dislock/internal/testenv"
)

// grantSetup is a holder's Backend and a waiter's, each with its watch
// running, the holder holding key and the waiter queued behind it (the
// holder's watch knows it is first). The waiter's Txn calls go through
// its txnGate, and its turns arrive on the channel returned.
func grantSetup(t *testing.T, c *etcdtest.Cluster, name, key string) (holder, waiter *etcdlock.Backend, g *txnGate, hold core.Lease, turns chan string, wreq core.AcquireRequest, prefix string) {
	ctx := testenv.Context(t, 30*time.Second)
	waiter, g, prefix = laneBackend(t, c, name)
	holder, err := etcdlock.NewBackend(c.Client(t), etcdlock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Close() })
	turns = make(chan string, 4)
	wctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{}, 2)
	done := make(chan struct{}, 2)
	go func() {
		holder.WatchTurns(wctx, func() { ready <- struct{}{} }, func(string, string) {})
		done <- struct{}{}
	}()
	go func() {
		waiter.WatchTurns(wctx, func() { ready <- struct{}{} }, func(_, w string) { turns <- w })
		done <- struct{}{}
	}()
	t.Cleanup(func() { cancel(); <-done; <-done })
	for range 2 {
		select {
		case <-ready:
		case <-ctx.Done():
			t.Fatal("the watches did not start")
		}
	}
	const ttl = 5 * time.Second
	hold, err = holder.TryAcquire(ctx, core.AcquireRequest{Key: key, Owner: "h", OwnerToken: "h-token", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	wreq = core.AcquireRequest{Key: key, Owner: "w", OwnerToken: "w-token-1", TTL: ttl, Waiter: "w", WaiterTTL: 30 * time.Second}
	if _, err := waiter.TryAcquire(ctx, wreq); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("the waiter's attempt while the key is held: %v, want busy", err)
	}
	if !testenv.WaitFor(10*time.Second, func() bool { w, ok := state.FirstWaiter(holder, key); return ok && w == "w" }) {
		t.Fatal("the holder's watch did not see the waiter queue")
	}
	return holder, waiter, g, hold, turns, wreq, prefix
}

// TestReleaseGrantsTheFirstWaiter: a release puts the key as its first
// waiter's in the same transaction; the waiter is told its turn and takes
// the lease without a request, with a larger token (the key's mod
// revision), and renews and releases it as any lease.
func TestReleaseGrantsTheFirstWaiter(t *testing.T) {
	c := etcdtest.Start(t, 1)
	ctx := testenv.Context(t, 30*time.Second)
	const key = "granted"
	holder, waiter, g, hold, turns, wreq, _ := grantSetup(t, c, "grant", key)
	before := c.Applied(0)
	if err := holder.Release(ctx, core.ReleaseRequest{Key: key, OwnerToken: "h-token", Token: hold.Token}); err != nil {
		t.Fatal(err)
	}
	select {
	case w := <-turns:
		if w != "w" {
			t.Fatalf("turn of %q, want w", w)
		}
	case <-ctx.Done():
		t.Fatal("the waiter was not told its turn")
	}
	g.mu.Lock()
	calls := len(g.nested)
	g.mu.Unlock()
	g.count.Store(true)           // count the waiter's Txn calls from here on
	wreq.OwnerToken = "w-token-2" // each attempt has an owner token of its own
	l, err := waiter.TryAcquire(ctx, wreq)
	if err != nil {
		t.Fatalf("the waiter's attempt at its turn: %v, want the lease", err)
	}
	g.mu.Lock()
	if n := len(g.nested); n != calls {
		t.Errorf("the waiter sent %d transactions to take a granted key, want none", n-calls)
	}
	g.mu.Unlock()
	if d := c.Applied(0) - before; d != 1 {
		t.Errorf("%d Raft entries for the release and the hand-off, want 1", d)
	}
	if l.Token <= hold.Token {
		t.Errorf("the waiter's token %d is not above the holder's %d", l.Token, hold.Token)
	}
	if info, held, err := waiter.Inspect(ctx, key); err != nil || !held || info.Owner != "w" || info.Token != l.Token {
		t.Errorf("the key after the hand-off: %+v %v %v, want held by w with token %d", info, held, err, l.Token)
	}
	errs, err := waiter.Renew(ctx, []core.RenewRequest{{Key: key, OwnerToken: wreq.OwnerToken, TTL: wreq.TTL}})
	if err != nil || errs[0] != nil {
		t.Fatalf("renewal of the granted lease: %v %v", err, errs)
	}
	if err := waiter.Release(ctx, core.ReleaseRequest{Key: key, OwnerToken: wreq.OwnerToken, Token: l.Token}); err != nil {
		t.Fatalf("release of the granted lease: %v", err)
	}
	if _, held, err := waiter.Inspect(ctx, key); err != nil || held {
		t.Errorf("the key after the waiter's release: held %v, %v", held, err)
	}
}

// TestGrantToAWaiterThatLeftIsDeleted: a release grants the key to a
// waiter whose Acquire stopped waiting while its Leave had not yet deleted
// its waiter key; the waiter's Backend deletes the grant, and the key is
// free.
func TestGrantToAWaiterThatLeftIsDeleted(t *testing.T) {
	c := etcdtest.Start(t, 1)
	ctx := testenv.Context(t, 30*time.Second)
	const key = "granted-left"
	holder, waiter, _, hold, _, _, _ := grantSetup(t, c, "grantleft", key)
	state.DropPlace(waiter, key, "w")
	if err := holder.Release(ctx, core.ReleaseRequest{Key: key, OwnerToken: "h-token", Token: hold.Token}); err != nil {
		t.Fatal(err)
	}
	if !testenv.WaitFor(10*time.Second, func() bool { _, held, err := holder.Inspect(ctx, key); return err == nil && !held }) {
		t.Fatal("the key granted to a waiter that left stays held")
	}
}

// TestReleaseWhenTheWaitersLeaseIsGone: a release whose grant names a
// lease the store no longer has is refused whole; the key is released
// without the grant, and the waiter is told its turn.
func TestReleaseWhenTheWaitersLeaseIsGone(t *testing.T) {
	c := etcdtest.Start(t, 1)
	ctx := testenv.Context(t, 30*time.Second)
	const key = "granted-lease-gone"
	holder, waiter, _, hold, turns, wreq, prefix := grantSetup(t, c, "grantgone", key)
	raw := c.Client(t)
	resp, err := raw.Get(ctx, prefix+"\x00q\x00"+key+"\x00w")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the waiter key: %v %v", resp, err)
	}
	var rec struct {
		Lease int64 `json:"lease"`
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil || rec.Lease == 0 {
		t.Fatalf("the waiter key's value %q: %v, want the lease of a grant", resp.Kvs[0].Value, err)
	}
	if _, err := raw.Revoke(ctx, clientv3.LeaseID(rec.Lease)); err != nil {
		t.Fatal(err)
	}
	if err := holder.Release(ctx, core.ReleaseRequest{Key: key, OwnerToken: "h-token", Token: hold.Token}); err != nil {
		t.Fatalf("release: %v", err)
	}
	select {
	case <-turns:
	case <-ctx.Done():
		t.Fatal("the waiter was not told its turn")
	}
	wreq.OwnerToken = "w-token-2"
	if _, err := waiter.TryAcquire(ctx, wreq); err != nil {
		t.Fatalf("the waiter's attempt at its turn: %v, want the lease", err)
	}
}
