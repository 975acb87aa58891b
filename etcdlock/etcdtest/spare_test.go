package etcdtest_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/etcdlock/etcdtest"
)

// keyLease returns the lease the lock key k is bound to, and its TTL.
func keyLease(t *testing.T, cli *clientv3.Client, k string) (clientv3.LeaseID, int64) {
	t.Helper()
	ctx := ctxT(t, 5*time.Second)
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

// TestSpareLease checks the reuse of a released lock's lease: the next
// claim takes it and refreshes it in the same round trip, and a spare that
// is gone (revoked behind the backend's back) is replaced by a new grant.
func TestSpareLease(t *testing.T) {
	c := etcdtest.Start(t, 1)
	admin := c.Client(t)
	prefix := uniquePrefix("spare")
	l := newLocker(t, c.Client(t), prefix, core.WithDefaults(core.TTL(6*time.Second)))

	s, err := l.TryAcquire(ctxT(t, 5*time.Second), "a")
	if err != nil {
		t.Fatal(err)
	}
	first, _ := keyLease(t, admin, prefix+"a")
	if err := s.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Unrenewed, the spare has about 4 s left after 2 s (it is reused
	// until half its TTL has passed); the claim's keepalive brings it back
	// to about 6 s.
	time.Sleep(2 * time.Second)
	s, err = l.TryAcquire(ctxT(t, 5*time.Second), "b")
	if err != nil {
		t.Fatal(err)
	}
	reused, ttl := keyLease(t, admin, prefix+"b")
	if reused != first {
		t.Fatalf("the claim did not reuse the released lease: %x, then %x", first, reused)
	}
	if ttl < 5 {
		t.Fatalf("the reused lease was not refreshed with the claim: TTL %d s of 6", ttl)
	}
	tok := s.Token()
	if err := s.Release(context.Background()); err != nil {
		t.Fatal(err)
	}

	// Revoked behind the backend's back: the claim finds the lease gone
	// and grants a new one.
	if _, err := admin.Revoke(ctxT(t, 5*time.Second), reused); err != nil {
		t.Fatal(err)
	}
	s, err = l.TryAcquire(ctxT(t, 5*time.Second), "b")
	if err != nil {
		t.Fatalf("claim after the spare was revoked: %v", err)
	}
	defer s.Release(context.Background())
	fresh, ttl := keyLease(t, admin, prefix+"b")
	if fresh == reused || ttl < 5 {
		t.Fatalf("lease %x (TTL %d) after the spare %x was revoked", fresh, ttl, reused)
	}
	if s.Token() <= tok {
		t.Errorf("token %d after %d", s.Token(), tok)
	}
}
