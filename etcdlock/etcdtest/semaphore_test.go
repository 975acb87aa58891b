package etcdtest_test

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dislock/dislock/etcdlock"
	"github.com/dislock/dislock/etcdlock/etcdtest"
	"github.com/dislock/dislock/internal/benchtest"
	"github.com/dislock/dislock/internal/testenv"
)

// The rules of semaphores are core/locktest's Semaphore rules, which
// TestConformance and TestConformanceCluster run; here is what is etcd's
// own.

// TestSemRenewBatch: one Renew call renews mutex leases and permits of
// several semaphores in one round trip: one transaction and one keepalive
// per lease on the backend's stream.
func TestSemRenewBatch(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	cnt := &etcdtest.Counter{}
	cfg := clientv3.Config{Endpoints: c.Endpoints(), Logger: zap.NewNop()}
	cfg.DialOptions = append(cfg.DialOptions, cnt.DialOptions()...)
	b, err := etcdlock.NewBackend(etcdtest.NewClient(t, cfg), etcdlock.WithPrefix(uniquePrefix("sem-renew")))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := testenv.Context(t, 30*time.Second)
	// A TTL the 40 claims cannot outlast on a busy machine: the first
	// leases are still held when the renewals are counted.
	const ttl = 30 * time.Second
	reqs := benchtest.MixedClaims(t, ctx, b, ttl)
	if _, err := b.Renew(ctx, reqs); err != nil { // opens the keepalive stream
		t.Fatal(err)
	}
	u0, s0, m0 := cnt.Unary.Load(), cnt.Streams.Load(), cnt.StreamMsgs.Load()
	benchtest.RenewAll(t, ctx, b, reqs)
	if u, s, m := cnt.Unary.Load()-u0, cnt.Streams.Load()-s0, cnt.StreamMsgs.Load()-m0; u != 1 || s != 0 || m != 1 {
		t.Fatalf("renewal of %d sessions of one TTL: %d transactions, %d streams opened, %d keepalives; want 1, 0, 1 (one shared lease)", len(reqs), u, s, m)
	}
}
