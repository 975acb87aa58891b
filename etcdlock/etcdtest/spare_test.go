package etcdtest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/namespace"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/etcdlock"
	"github.com/dislock/dislock/etcdlock/etcdtest"
	"github.com/dislock/dislock/internal/testenv"
)

// keyLease returns the lease the lock key k is bound to, and its TTL.
func keyLease(t *testing.T, cli *clientv3.Client, k string) (clientv3.LeaseID, int64) {
	t.Helper()
	ctx := testenv.Context(t, 5*time.Second)
	resp, err := cli.Get(ctx, k)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("Get %s: %v %v", k, resp, err)
	}
	id := clientv3.LeaseID(resp.Kvs[0].Lease)
	ttl, err := cli.TimeToLive(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return id, ttl.TTL
}

// lostWithin waits for s to be lost.
func lostWithin(t *testing.T, s core.Session, d time.Duration, what string) {
	t.Helper()
	select {
	case <-s.Context().Done():
	case <-time.After(d):
		t.Fatalf("%s: session %q not lost within %v", what, s.Key(), d)
	}
}

// TestSharedLease checks that the sessions of one Locker with one TTL are
// bound to one lease, that a forced release of one key ends only its
// session, and that the loss of the lease is the loss of every session on
// it, after which a claim takes a new lease.
func TestSharedLease(t *testing.T) {
	c := etcdtest.Start(t, 1)
	admin := c.Client(t)
	prefix := uniquePrefix("shared")
	l := newLocker(t, c.Client(t), prefix, core.WithDefaults(core.TTL(3*time.Second)))
	other := newLocker(t, c.Client(t), prefix)

	var ss []core.Session
	for _, k := range []string{"a", "b", "c"} {
		s := testenv.Hold(t, testenv.Context(t, 5*time.Second), l, k)
		defer s.Release(context.Background())
		ss = append(ss, s)
	}
	lease, _ := keyLease(t, admin, prefix+"a")
	for _, k := range []string{"b", "c"} {
		if id, _ := keyLease(t, admin, prefix+k); id != lease {
			t.Fatalf("key %s on lease %x, key a on %x: not shared", k, id, lease)
		}
	}

	if ok, err := other.ForceRelease(testenv.Context(t, 5*time.Second), "a"); err != nil || !ok {
		t.Fatalf("ForceRelease: %v %v", ok, err)
	}
	lostWithin(t, ss[0], 5*time.Second, "after ForceRelease")
	// Two renewals later the other sessions still hold their keys.
	time.Sleep(2500 * time.Millisecond)
	for _, s := range ss[1:] {
		if err := s.Check(testenv.Context(t, 5*time.Second)); err != nil {
			t.Fatalf("session %q ended with the forced release of another key: %v", s.Key(), err)
		}
	}
	if _, ttl := keyLease(t, admin, prefix+"b"); ttl < 1 {
		t.Fatalf("shared lease not renewed: TTL %d s", ttl)
	}

	// The lease revoked: every session on it is lost.
	if _, err := admin.Revoke(testenv.Context(t, 5*time.Second), lease); err != nil {
		t.Fatal(err)
	}
	for _, s := range ss[1:] {
		lostWithin(t, s, 5*time.Second, "after the lease was revoked")
	}
	s, err := l.TryAcquire(testenv.Context(t, 5*time.Second), "d")
	if err != nil {
		t.Fatalf("claim after the shared lease was revoked: %v", err)
	}
	defer s.Release(context.Background())
	if id, ttl := keyLease(t, admin, prefix+"d"); id == lease || ttl < 2 {
		t.Fatalf("lease %x (TTL %d s) after the shared lease %x was revoked", id, ttl, lease)
	}
}

// TestSharedLeaseSweepsUnrenewed checks that a key on the shared lease
// whose session no renewal asks for any more (it ended without a release
// that reached the store) is deleted once its lease TTL has passed, as a
// lease of its own would have expired, while the renewed key stays.
func TestSharedLeaseSweepsUnrenewed(t *testing.T) {
	c := etcdtest.Start(t, 1)
	admin := c.Client(t)
	prefix := uniquePrefix("sweep")
	b, err := etcdlock.NewBackend(c.Client(t), etcdlock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ttl := 1500 * time.Millisecond // a 2 s lease
	left := core.AcquireRequest{Key: "left", Owner: "t", OwnerToken: "left-token", TTL: ttl}
	kept := core.AcquireRequest{Key: "kept", Owner: "t", OwnerToken: "kept-token", TTL: ttl}
	for _, r := range []core.AcquireRequest{left, kept} {
		if _, err := b.TryAcquire(testenv.Context(t, 5*time.Second), r); err != nil {
			t.Fatal(err)
		}
	}
	claimed := time.Now()
	renew := []core.RenewRequest{{Key: kept.Key, OwnerToken: kept.OwnerToken, TTL: ttl}}
	for time.Since(claimed) < 3*time.Second {
		res, err := b.Renew(testenv.Context(t, 5*time.Second), renew)
		if err != nil || res[0] != nil {
			t.Fatalf("renew: %v %v", res, err)
		}
		resp, err := admin.Get(testenv.Context(t, 5*time.Second), prefix+"left")
		if err != nil {
			t.Fatal(err)
		}
		if gone := len(resp.Kvs) == 0; gone && time.Since(claimed) < 2*time.Second {
			t.Fatalf("the unrenewed key was deleted after %v, before its lease TTL", time.Since(claimed))
		} else if gone {
			if _, ttl := keyLease(t, admin, prefix+"kept"); ttl < 1 {
				t.Fatalf("the renewed key's lease has %d s left", ttl)
			}
			return
		}
		time.Sleep(300 * time.Millisecond) // a renew interval
	}
	t.Fatal("the key no renewal asked for was still held 3 s after its claim (2 s lease)")
}

// serverLeases returns the IDs of the leases on the server.
func serverLeases(t *testing.T, cli *clientv3.Client) []clientv3.LeaseID {
	t.Helper()
	r, err := cli.Leases(testenv.Context(t, 5*time.Second))
	if err != nil {
		t.Fatalf("Leases: %v", err)
	}
	ids := make([]clientv3.LeaseID, len(r.Leases))
	for i, l := range r.Leases {
		ids[i] = l.ID
	}
	return ids
}

// TestSharedLeaseConcurrentFirstClaims checks that a Locker's first
// claims, made at once on many goroutines, all bind their keys to one
// lease (one grant, whose reply the others wait for), and that Close,
// which releases them, leaves no lease on the server.
func TestSharedLeaseConcurrentFirstClaims(t *testing.T) {
	c := etcdtest.Start(t, 1)
	admin := c.Client(t)
	prefix := uniquePrefix("first")
	l := newLocker(t, c.Client(t), prefix)
	const n = 32
	start := make(chan struct{})
	errs := make(chan error, n)
	for i := range n {
		go func() {
			<-start
			_, err := l.TryAcquire(testenv.Context(t, 10*time.Second), fmt.Sprint("k", i), core.TTL(5*time.Second))
			errs <- err
		}()
	}
	close(start)
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if ids := serverLeases(t, admin); len(ids) != 1 {
		t.Fatalf("%d concurrent first claims left %d leases on the server, want 1: %v", n, len(ids), ids)
	}
	for i := range n {
		if _, ttl := keyLease(t, admin, fmt.Sprint(prefix, "k", i)); ttl < 1 {
			t.Fatalf("key k%d: lease TTL %d s", i, ttl)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if ids := serverLeases(t, admin); len(ids) != 0 {
		t.Fatalf("Close left %d leases on the server: %v", len(ids), ids)
	}
}

// TestNamespacedClient checks that a Locker on a client whose KV, Watcher
// and Lease are etcd's namespace wrappers keeps all of its keys inside the
// namespace: its claims, busy answers, renewals, waiters and releases go
// through the client's KV, not around it.
func TestNamespacedClient(t *testing.T) {
	c := etcdtest.Start(t, 1)
	admin := c.Client(t)
	ns := uniquePrefix("ns")
	cli := c.Client(t)
	cli.KV = namespace.NewKV(cli.KV, ns)
	cli.Watcher = namespace.NewWatcher(cli.Watcher, ns)
	cli.Lease = namespace.NewLease(cli.Lease, ns)
	l := newLocker(t, cli, "locks/", core.WithDefaults(core.TTL(2*time.Second)))
	other := newLocker(t, cli, "locks/")
	ctx := testenv.Context(t, 10*time.Second)

	s := testenv.Hold(t, ctx, l, "k")
	resp, err := admin.Get(ctx, ns+"locks/k")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the lock key inside the namespace: %v %v", resp, err)
	}
	if resp, err := admin.Get(ctx, "locks/k"); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("a lock key outside the namespace: %v %v", resp, err)
	}
	if _, err := other.TryAcquire(ctx, "k"); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("TryAcquire of the held key: %v, want busy", err)
	}
	waited := make(chan error, 1)
	go func() { // a waiter in line: its key, its turn, its claim
		w, err := other.Acquire(ctx, "k")
		if err == nil {
			err = w.Release(ctx)
		}
		waited <- err
	}()
	time.Sleep(3 * time.Second) // renewals, past the TTL
	if err := s.Context().Err(); err != nil {
		t.Fatalf("the session was lost: %v", context.Cause(s.Context()))
	}
	if resp, err := admin.Get(ctx, ns+"locks/\x00q\x00", clientv3.WithPrefix()); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the waiter key inside the namespace: %v %v", resp, err)
	}
	if err := s.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("the waiter's Acquire and Release: %v", err)
	}
	if resp, err := admin.Get(ctx, ns, clientv3.WithPrefix()); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("keys left in the namespace: %v %v", resp, err)
	}
}
