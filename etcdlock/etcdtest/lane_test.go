package etcdtest_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/etcdlock"
	"github.com/dislock/dislock/etcdlock/etcdtest"
	"github.com/dislock/dislock/etcdlock/internal/state"
	"github.com/dislock/dislock/internal/lane"
	"github.com/dislock/dislock/internal/testenv"
)

// txnGate is a client interceptor that records how many transactions each
// Txn call carries (nested in one that compares nothing, or 1) and, once
// armed, holds the first lane.MaxSenders Txn calls until it is opened.
type txnGate struct {
	mu      sync.Mutex
	nested  []int
	armed   atomic.Bool // record, and hold the first calls
	count   atomic.Bool // record only
	holding atomic.Int32
	open    chan struct{}
}

func (g *txnGate) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if r, ok := req.(*etcdserverpb.TxnRequest); ok {
		n := 1
		if len(r.Compare) == 0 && len(r.Success) > 0 && r.Success[0].GetRequestTxn() != nil {
			n = len(r.Success)
		}
		g.mu.Lock()
		if g.armed.Load() || g.count.Load() {
			g.nested = append(g.nested, n)
		}
		g.mu.Unlock()
		if g.armed.Load() && g.holding.Add(1) <= lane.MaxSenders {
			<-g.open
		}
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// laneBackend is a Backend on a client of c whose Txn calls go through a
// txnGate.
func laneBackend(t *testing.T, c *etcdtest.Cluster, name string, opts ...etcdlock.Option) (*etcdlock.Backend, *txnGate, string) {
	g := &txnGate{open: make(chan struct{})}
	cli := etcdtest.NewClient(t, clientv3.Config{Endpoints: c.Endpoints(),
		DialOptions: []grpc.DialOption{grpc.WithUnaryInterceptor(g.intercept)}})
	prefix := uniquePrefix(name)
	b, err := etcdlock.NewBackend(cli, append([]etcdlock.Option{etcdlock.WithPrefix(prefix)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, g, prefix
}

// occupy arms g and starts lane.MaxSenders claims of b that g holds, one
// at a time: b's lane then has every sender at work, and the calls made
// next queue. It returns a wait for those claims' outcomes.
func occupy(t *testing.T, ctx context.Context, b *etcdlock.Backend, g *txnGate, ttl time.Duration) func() {
	g.armed.Store(true)
	var wg sync.WaitGroup
	for i := range lane.MaxSenders {
		key := "occupy-" + string(rune('0'+i))
		wg.Go(func() {
			if _, err := b.TryAcquire(ctx, core.AcquireRequest{Key: key, Owner: "o", OwnerToken: key, TTL: ttl}); err != nil {
				t.Errorf("claim of %s: %v", key, err)
			}
		})
		if !testenv.WaitFor(10*time.Second, func() bool { return g.holding.Load() == int32(i+1) }) {
			t.Fatalf("%d Txn calls held, want %d", g.holding.Load(), i+1)
		}
	}
	return wg.Wait
}

// queue starts f and waits until b's lane has n calls queued.
func queue(t *testing.T, b *etcdlock.Backend, n int, f func()) {
	go f()
	if !testenv.WaitFor(10*time.Second, func() bool { _, q, _ := state.Lane(b); return q == n }) {
		_, q, _ := state.Lane(b)
		t.Fatalf("%d calls queued, want %d", q, n)
	}
}

// claimQueued queues the claims reqs of b one after another behind the
// claims occupy held, opens the gate and returns each claim's error.
func claimQueued(t *testing.T, ctx context.Context, b *etcdlock.Backend, g *txnGate, occupied func(), reqs []core.AcquireRequest) []error {
	var wg sync.WaitGroup
	errs := make([]error, len(reqs))
	for i, r := range reqs {
		queue(t, b, i+1, func() { wg.Go(func() { _, errs[i] = b.TryAcquire(ctx, r) }) })
	}
	close(g.open)
	wg.Wait()
	occupied()
	return errs
}

// TestTxnsThatMeetShareOneEntry: while a backend's transactions are on
// their way, the claims and releases made meanwhile on distinct keys go as
// one transaction, one Raft entry, and each gets its own answer: free keys
// are claimed, with that transaction's revision (their create revision) as
// their token, a key held by another process is answered busy with its
// holder, and a lease is released. A second claim of a key already in the
// batch goes in a transaction after it.
func TestTxnsThatMeetShareOneEntry(t *testing.T) {
	c := etcdtest.Start(t, 1)
	ctx := testenv.Context(t, 30*time.Second)
	b, g, prefix := laneBackend(t, c, "lane")
	const ttl = 5 * time.Second
	other := newLocker(t, c.Client(t), prefix)
	s := testenv.Hold(t, ctx, other, "held")
	defer s.Release(ctx)
	req := func(key, token string) core.AcquireRequest {
		return core.AcquireRequest{Key: key, Owner: token, OwnerToken: token, TTL: ttl}
	}
	rel, err := b.TryAcquire(ctx, req("released", "r"))
	if err != nil {
		t.Fatal(err)
	}
	occupied := occupy(t, ctx, b, g, ttl)

	type result struct {
		lease core.Lease
		err   error
	}
	free := []string{"free-0", "free-1", "free-2", "free-3"}
	results := make([]result, len(free)+3)
	var wg sync.WaitGroup
	n := 0
	claim := func(i int, r core.AcquireRequest) {
		n++
		queue(t, b, n, func() {
			wg.Go(func() {
				l, err := b.TryAcquire(ctx, r)
				results[i] = result{l, err}
			})
		})
	}
	for i, k := range free {
		claim(i, req(k, "t-"+k))
	}
	claim(len(free), req("held", "t-held"))
	n++
	queue(t, b, n, func() {
		wg.Go(func() {
			results[len(free)+1].err = b.Release(ctx, core.ReleaseRequest{Key: "released", OwnerToken: "r", Token: rel.Token})
		})
	})
	claim(len(free)+2, req("free-0", "t-again"))
	close(g.open)
	wg.Wait()
	occupied()

	for i, k := range free {
		r := results[i]
		if r.err != nil {
			t.Fatalf("claim of %s: %v", k, r.err)
		}
		if r.lease.Token != results[0].lease.Token {
			t.Errorf("token of %s: %d, want %d: the claims were not one transaction", k, r.lease.Token, results[0].lease.Token)
		}
		info, held, err := b.Inspect(ctx, k)
		if err != nil || !held || info.Owner != "t-"+k || info.Token != r.lease.Token {
			t.Errorf("%s in the store: %+v %v, want held by t-%s with token %d", k, info, err, k, r.lease.Token)
		}
	}
	var busy *core.NotAcquiredError
	if err := results[len(free)].err; !errors.As(err, &busy) || busy.Holder == nil || busy.Holder.Token != s.Token() {
		t.Errorf("claim of a key held by another process: %v, want busy with its holder (token %d)", err, s.Token())
	}
	if err := results[len(free)+1].err; err != nil {
		t.Errorf("release in the batch: %v", err)
	}
	if info, held, err := b.Inspect(ctx, "released"); err != nil || held {
		t.Errorf("released key: %+v %v, want free", info, err)
	}
	if err := results[len(free)+2].err; !errors.Is(err, core.ErrNotAcquired) {
		t.Errorf("second claim of free-0: %v, want busy (held by the first)", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	want := []int{1, 1, 1, len(free) + 2, 1}
	if len(g.nested) < len(want) || !slices.Equal(g.nested[:len(want)], want) {
		t.Errorf("transactions per Txn call: %v, want %v first", g.nested, want)
	}
}

// TestNestedTxnRefusedWhole: when the server refuses a transaction of
// nested ones whole, before it applies anything — one claim's lease is
// gone — each is sent on its own, and the claims on a live lease stay on
// it.
func TestNestedTxnRefusedWhole(t *testing.T) {
	c := etcdtest.Start(t, 1)
	ctx := testenv.Context(t, 30*time.Second)
	b, g, prefix := laneBackend(t, c, "refused")
	raw := c.Client(t)
	req := func(key string, ttl time.Duration) core.AcquireRequest {
		return core.AcquireRequest{Key: key, Owner: key, OwnerToken: key, TTL: ttl}
	}
	leaseOf := func(key string) int64 {
		resp, err := raw.Get(ctx, prefix+key)
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("%s in the store: %v %v", key, resp, err)
		}
		return resp.Kvs[0].Lease
	}
	for _, r := range []core.AcquireRequest{req("a0", 5*time.Second), req("b0", 10*time.Second)} {
		if _, err := b.TryAcquire(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	la, lb := leaseOf("a0"), leaseOf("b0")
	if la == lb {
		t.Fatalf("claims of two TTLs share lease %x", la)
	}
	if _, err := raw.Revoke(ctx, clientv3.LeaseID(lb)); err != nil {
		t.Fatal(err)
	}
	occupied := occupy(t, ctx, b, g, 5*time.Second)
	errs := claimQueued(t, ctx, b, g, occupied, []core.AcquireRequest{req("a1", 5*time.Second), req("b1", 10*time.Second), req("a2", 5*time.Second)})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("claim %d: %v", i, err)
		}
	}
	if l1, l2 := leaseOf("a1"), leaseOf("a2"); l1 != la || l2 != la {
		t.Errorf("claims on the live lease %x are on %x and %x: the refusal was taken for theirs", la, l1, l2)
	}
	if l := leaseOf("b1"); l == lb {
		t.Errorf("b1 is on the revoked lease")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.nested) < 4 || g.nested[3] != 3 {
		t.Errorf("transactions per Txn call: %v, want three nested in the fourth", g.nested)
	}
}

// TestNestedTxnsWithinTheOpsLimit: with a limit of operations per
// transaction (WithMaxTxnOps) too small to nest any two claims, the
// queued claims go one transaction each.
func TestNestedTxnsWithinTheOpsLimit(t *testing.T) {
	c := etcdtest.Start(t, 1)
	ctx := testenv.Context(t, 30*time.Second)
	b, g, _ := laneBackend(t, c, "opslimit", etcdlock.WithMaxTxnOps(3))
	occupied := occupy(t, ctx, b, g, 5*time.Second)
	var reqs []core.AcquireRequest
	for _, key := range []string{"k0", "k1", "k2"} {
		reqs = append(reqs, core.AcquireRequest{Key: key, Owner: key, OwnerToken: key, TTL: 5 * time.Second})
	}
	for i, err := range claimQueued(t, ctx, b, g, occupied, reqs) {
		if err != nil {
			t.Errorf("claim %d: %v", i, err)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if want := []int{1, 1, 1, 1, 1, 1}; !slices.Equal(g.nested, want) {
		t.Errorf("transactions per Txn call: %v, want %v", g.nested, want)
	}
}
