package etcdtest_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/etcdlock"
	"github.com/dislock/dislock/etcdlock/etcdtest"
	"github.com/dislock/dislock/internal/testenv"
)

// faultTTL is the lease of the fault tests: long enough that an election
// (100 ms here) fits many times into the margin TTL - RenewDeadline.
const faultTTL = 2 * time.Second

// sendTimes wraps a Backend and records the send time of every TryAcquire
// that succeeded: the store applied that acquire no earlier.
type sendTimes struct {
	core.Backend
	mu    sync.Mutex
	first time.Time
}

func (s *sendTimes) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	sent := time.Now()
	l, err := s.Backend.TryAcquire(ctx, req)
	if err == nil {
		s.mu.Lock()
		if s.first.IsZero() {
			s.first = sent
		}
		s.mu.Unlock()
	}
	return l, err
}

func (s *sendTimes) firstAcquire() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.first
}

// handOver releases s after what (a fault the lock was held through) and
// checks that other then gets key, with a larger token.
func handOver(t *testing.T, s core.Session, other *core.Client, key, what string) {
	t.Helper()
	tok := s.Token()
	if err := s.Release(context.Background()); err != nil {
		t.Fatalf("Release after %s: %v", what, err)
	}
	s2, err := other.TryAcquire(testenv.Context(t, 10*time.Second), key)
	if err != nil {
		t.Fatalf("free lock not acquired after %s: %v", what, err)
	}
	defer s2.Release(context.Background())
	if s2.Token() <= tok {
		t.Errorf("token %d after %d: not increasing across %s", s2.Token(), tok, what)
	}
}

func newLocker(t testing.TB, cli *clientv3.Client, prefix string, opts ...core.ClientOption) *core.Client {
	t.Helper()
	l, err := etcdlock.New(cli, etcdlock.WithPrefix(prefix), etcdlock.WithClientOptions(opts...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// holdJob acquires the key "job" through l, or fails the test.
func holdJob(t *testing.T, l *core.Client) core.Session {
	t.Helper()
	return testenv.Hold(t, testenv.Context(t, 10*time.Second), l, "job")
}

// othersThan is every member of c but member at.
func othersThan(c *etcdtest.Cluster, at int) []int {
	var others []int
	for i := range c.Size() {
		if i != at {
			others = append(others, i)
		}
	}
	return others
}

// lossBeforeTakeover holds a lock through a client on member holderAt only,
// injects fault, and checks that the holder learns of its loss before a
// process on the other members acquires the lock (by the send time of that
// acquire), and that the fencing token grows.
func lossBeforeTakeover(t *testing.T, c *etcdtest.Cluster, holderAt int, fault func()) (lost, taken core.Session, admin core.Admin) {
	prefix := uniquePrefix("takeover")
	holder := newLocker(t, c.Client(t, holderAt), prefix, core.WithDefaults(core.TTL(faultTTL)))
	others := othersThan(c, holderAt)
	ob, err := etcdlock.NewBackend(c.Client(t, others...), etcdlock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	rec := &sendTimes{Backend: ob}
	other := testenv.Client(t, rec, core.WithDefaults(core.TTL(faultTTL)))

	s := holdJob(t, holder)
	lostc := make(chan time.Time, 1)
	go func() { <-s.Done(); lostc <- time.Now() }()

	faultAt := time.Now()
	fault()
	// The other process waits, and tries again after errors: requests
	// that reached the old leader time out, so each wait is bounded.
	giveUp := time.Now().Add(30 * time.Second)
	var s2 core.Session
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		s2, err = other.Acquire(ctx, "job", core.Backoff(10*time.Millisecond, 50*time.Millisecond))
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(giveUp) {
			t.Fatalf("the other process never took over: %v", err)
		}
	}
	t.Cleanup(func() { s2.Release(context.Background()) })
	var lostAt time.Time
	select {
	case lostAt = <-lostc:
	default:
		t.Fatalf("another process acquired the lock %v after the fault while the holder's session is live",
			rec.firstAcquire().Sub(faultAt))
	}
	if !errors.Is(s.Err(), core.ErrLeaseLost) {
		t.Errorf("holder's session ended with %v, want ErrLeaseLost", s.Err())
	}
	took := rec.firstAcquire()
	if !lostAt.Before(took) {
		t.Errorf("holder learned of its loss %v after the fault, the takeover was sent at %v: not before",
			lostAt.Sub(faultAt), took.Sub(faultAt))
	}
	if s2.Token() <= s.Token() {
		t.Errorf("token %d after %d: not increasing across the failover", s2.Token(), s.Token())
	}
	t.Logf("loss signalled %v after the fault, takeover sent %v after it; tokens %d -> %d",
		lostAt.Sub(faultAt).Round(time.Millisecond), took.Sub(faultAt).Round(time.Millisecond), s.Token(), s2.Token())
	return s, s2, ob
}

// staleReleaseKeepsNewHolder releases the lost session (as its process
// does once its work has stopped) and checks that the new holder still
// holds the key.
func staleReleaseKeepsNewHolder(t *testing.T, lost, taken core.Session, admin core.Admin) {
	t.Helper()
	if err := lost.Release(testenv.Context(t, 10*time.Second)); err != nil {
		t.Fatalf("Release of the lost session: %v", err)
	}
	info, held, err := admin.Inspect(testenv.Context(t, 10*time.Second), taken.Key())
	if err != nil || !held || info.Token != taken.Token() {
		t.Fatalf("after the old holder's release the key is %+v (held %v, %v), want token %d", info, held, err, taken.Token())
	}
	if taken.Err() != nil {
		t.Fatalf("the new holder lost its lock: %v", taken.Err())
	}
}

// TestPartitionedHolder cuts the holder's member off from the rest of a
// 3-member cluster: when it is the leader, and when it is a follower.
func TestPartitionedHolder(t *testing.T) {
	for _, role := range []string{"Leader", "Follower"} {
		t.Run(role, func(t *testing.T) {
			c := etcdtest.Start(t, 3)
			at := c.Leader()
			if role == "Follower" {
				at = (at + 1) % c.Size()
			}
			lost, taken, admin := lossBeforeTakeover(t, c, at, func() { c.Partition(at) })
			// Healed, the old member serves the new holder's state, and
			// the old holder's release leaves the new holder's key alone.
			c.Heal(at)
			cli := c.Client(t, at)
			etcdtest.WaitHealthy(t, cli, 10*time.Second)
			staleReleaseKeepsNewHolder(t, lost, taken, admin)
		})
	}
}

// TestLeaderKilled kills the leader of a 3-member cluster.
func TestLeaderKilled(t *testing.T) {
	t.Run("HolderOnLeaderOnly", func(t *testing.T) {
		c := etcdtest.Start(t, 3)
		lead := c.Leader()
		lossBeforeTakeover(t, c, lead, func() { c.Kill(lead) })
	})
	t.Run("HolderOnAllMembers", func(t *testing.T) {
		// A client on every member fails over: the new leader extends every
		// lease when it takes over, and the session survives.
		c := etcdtest.Start(t, 3)
		prefix := uniquePrefix("failover")
		holder := newLocker(t, c.Client(t), prefix, core.WithDefaults(core.TTL(faultTTL)))
		s := holdJob(t, holder)
		lead := c.Leader()
		others := othersThan(c, lead)
		other := newLocker(t, c.Client(t, others...), prefix, core.WithDefaults(core.TTL(faultTTL)))
		c.Kill(lead)
		deadline := time.Now().Add(2 * faultTTL)
		for time.Now().Before(deadline) {
			_, err := other.TryAcquire(testenv.Context(t, 5*time.Second), "job")
			if err == nil {
				t.Fatal("another process acquired a lock whose holder is alive")
			}
			if s.Err() != nil {
				t.Fatalf("the holder lost its lock on failover: %v", s.Err())
			}
			time.Sleep(50 * time.Millisecond)
		}
		handOver(t, s, other, "job", "the failover")
	})
}

// TestRollingRestart restarts every member of a 3-member cluster in turn
// while a lock is held through a client on all members.
func TestRollingRestart(t *testing.T) {
	c := etcdtest.Start(t, 3)
	prefix := uniquePrefix("restart")
	holder := newLocker(t, c.Client(t), prefix, core.WithDefaults(core.TTL(faultTTL)))
	s := holdJob(t, holder)
	other := newLocker(t, c.Client(t), prefix, core.WithDefaults(core.TTL(faultTTL)))
	for i := range c.Size() {
		start := time.Now()
		c.Restart(i)
		etcdtest.WaitHealthy(t, c.Client(t, i), 10*time.Second)
		t.Logf("member %d restarted and healthy after %v", i, time.Since(start).Round(time.Millisecond))
		if _, err := other.TryAcquire(testenv.Context(t, 10*time.Second), "job"); !errors.Is(err, core.ErrNotAcquired) {
			t.Fatalf("after restarting member %d: TryAcquire = %v, want busy (holder: %v)", i, err, s.Err())
		}
		if s.Err() != nil {
			t.Fatalf("after restarting member %d the holder lost its lock: %v", i, s.Err())
		}
	}
	handOver(t, s, other, "job", "the restarts")
}

// TestSingleMemberRestart restarts the only member: the holder's renewals
// fail while it is down, and succeed again within the renew deadline.
func TestSingleMemberRestart(t *testing.T) {
	c := etcdtest.Start(t, 1)
	prefix := uniquePrefix("restart1")
	holder := newLocker(t, c.Client(t), prefix, core.WithDefaults(core.TTL(3*time.Second)))
	s := holdJob(t, holder)
	c.Restart(0)
	d0 := s.Deadline()
	cli := c.Client(t)
	etcdtest.WaitHealthy(t, cli, 10*time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for !s.Deadline().After(d0) && s.Err() == nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if s.Err() != nil || !s.Deadline().After(d0) {
		t.Fatalf("no renewal after the restart: err %v", s.Err())
	}
	other := newLocker(t, cli, prefix)
	if _, err := other.TryAcquire(testenv.Context(t, 10*time.Second), "job"); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("TryAcquire after restart = %v, want busy", err)
	}
	handOver(t, s, other, "job", "the restart")
}

// TestCompaction compacts the store's history (physically) while a lock is
// held and another process waits on the release watch: renewals, the watch
// and tokens are unaffected.
func TestCompaction(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cli := c.Client(t)
	prefix := uniquePrefix("compact")
	a := newLocker(t, c.Client(t), prefix, core.WithDefaults(core.TTL(time.Second)))
	var bWatch etcdtest.Counter
	bCli := etcdtest.NewClient(t, clientv3.Config{Endpoints: c.Endpoints(), DialOptions: bWatch.DialOptions()})
	b := newLocker(t, bCli, prefix, core.WithDefaults(core.TTL(time.Second)))
	var last uint64
	for range 20 {
		s := holdJob(t, a)
		last = s.Token()
		s.Release(context.Background())
	}
	s := holdJob(t, a)
	got := make(chan core.Session, 1)
	go func() {
		// Polls every 20 s: only the watch can wake it in time.
		s2, err := b.Acquire(testenv.Context(t, 30*time.Second), "job", core.Backoff(20*time.Second, 20*time.Second))
		if err != nil {
			t.Error(err)
		}
		got <- s2
	}()
	// The waiter's watch is up before the compaction, which it outlives.
	if !testenv.WaitFor(10*time.Second, func() bool { return bWatch.Watches.Load() > 0 }) {
		t.Fatal("the waiter's watch not up within 10s")
	}
	resp, err := cli.Get(testenv.Context(t, 5*time.Second), "compaction")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(testenv.Context(t, 5*time.Second), resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // several renewals after the compaction
	if s.Err() != nil {
		t.Fatalf("holder lost its lock after compaction: %v", s.Err())
	}
	if s.Token() <= last {
		t.Errorf("token %d after %d", s.Token(), last)
	}
	released := time.Now()
	s.Release(context.Background())
	select {
	case s2 := <-got:
		if s2 == nil {
			t.FailNow()
		}
		if d := time.Since(released); d > 2*time.Second {
			t.Errorf("waiter woke %v after the release", d)
		}
		if s2.Token() <= s.Token() {
			t.Errorf("token %d after %d", s2.Token(), s.Token())
		}
		info, held, err := b.Inspect(testenv.Context(t, 5*time.Second), "job")
		if err != nil || !held || info.Token != s2.Token() {
			t.Errorf("Inspect after compaction = %+v %v %v", info, held, err)
		}
		s2.Release(context.Background())
	case <-time.After(10 * time.Second):
		t.Fatal("waiter not woken after compaction")
	}
}

// dropReplies is a gRPC interceptor that lets a request reach the server
// and then reports the reply as lost, for the next request that match
// selects.
type dropReplies struct {
	match   atomic.Value // func(method string, req any) bool
	dropped atomic.Int32
	lease   atomic.Int64 // the lease of the last dropped grant or claim
}

func (d *dropReplies) arm(match func(method string, req any) bool) { d.match.Store(match) }

func (d *dropReplies) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if m, _ := d.match.Load().(func(string, any) bool); m != nil && err == nil && m(method, req) {
		d.match.Store(func(string, any) bool { return false })
		d.dropped.Add(1)
		switch r := req.(type) {
		case *pb.LeaseGrantRequest:
			d.lease.Store(r.ID)
		case *pb.TxnRequest:
			if len(r.Success) == 1 && r.Success[0].GetRequestPut() != nil {
				d.lease.Store(r.Success[0].GetRequestPut().Lease)
			}
		}
		return status.Error(codes.Unavailable, "reply lost (injected)")
	}
	return err
}

// TestLostReply loses the reply of requests the server applied: a lock
// claim, a lease grant and a lease revoke. Nothing stays held or leased.
func TestLostReply(t *testing.T) {
	c := etcdtest.Start(t, 1)
	admin := c.Client(t)
	drop := &dropReplies{}
	cli := etcdtest.NewClient(t, clientv3.Config{
		Endpoints:   c.Endpoints(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(drop.intercept)},
	})
	prefix := uniquePrefix("lost")
	a := newLocker(t, cli, prefix, core.WithDefaults(core.TTL(30*time.Second)))
	b := newLocker(t, admin, prefix)
	// noLeases checks that no lease holds a key (a Backend keeps unused
	// leases for its next claims) and that the lease of the request whose
	// reply was lost, if any, is gone.
	noLeases := func(t *testing.T) {
		t.Helper()
		ctx := testenv.Context(t, 5*time.Second)
		ls, err := admin.Leases(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls.Leases {
			ttl, err := admin.TimeToLive(ctx, l.ID, clientv3.WithAttachedKeys())
			if err != nil {
				t.Fatal(err)
			}
			if len(ttl.Keys) != 0 {
				t.Errorf("lease %x still holds %q", l.ID, ttl.Keys)
			}
		}
		if id := drop.lease.Load(); id != 0 {
			if ttl, err := admin.TimeToLive(ctx, clientv3.LeaseID(id)); err != nil || ttl.TTL != -1 {
				t.Errorf("the lease of the lost request is still there: %+v %v", ttl, err)
			}
		}
	}
	free := func(t *testing.T, key string) {
		t.Helper()
		s, err := b.TryAcquire(testenv.Context(t, 5*time.Second), key)
		if err != nil {
			t.Fatalf("%s not free: %v", key, err)
		}
		s.Release(context.Background())
	}
	isClaim := func(method string, req any) bool {
		r, ok := req.(*pb.TxnRequest)
		return ok && method == "/etcdserverpb.KV/Txn" && len(r.Success) == 1 && r.Success[0].GetRequestPut() != nil
	}
	t.Run("Claim", func(t *testing.T) {
		drop.arm(isClaim)
		_, err := a.TryAcquire(testenv.Context(t, 10*time.Second), "claim")
		if err == nil || errors.Is(err, core.ErrNotAcquired) || drop.dropped.Load() != 1 {
			t.Fatalf("TryAcquire = %v, want a backend error (dropped %d)", err, drop.dropped.Load())
		}
		free(t, "claim")
		noLeases(t)
	})
	t.Run("Grant", func(t *testing.T) {
		drop.dropped.Store(0)
		drop.arm(func(method string, _ any) bool { return method == "/etcdserverpb.Lease/LeaseGrant" })
		_, err := a.TryAcquire(testenv.Context(t, 10*time.Second), "grant")
		if err == nil || drop.dropped.Load() != 1 {
			t.Fatalf("TryAcquire = %v, want a backend error (dropped %d)", err, drop.dropped.Load())
		}
		noLeases(t)
		free(t, "grant")
	})
	t.Run("Release", func(t *testing.T) {
		s := testenv.Hold(t, testenv.Context(t, 10*time.Second), a, "release")
		drop.dropped.Store(0)
		drop.lease.Store(0)
		drop.arm(func(method string, req any) bool {
			r, ok := req.(*pb.TxnRequest)
			return ok && len(r.Success) == 1 && r.Success[0].GetRequestDeleteRange() != nil
		})
		// The release's delete was applied; a Release that failed may be
		// called again, and finds the key gone.
		if err := s.Release(context.Background()); err != nil {
			if err := s.Release(context.Background()); err != nil {
				t.Fatalf("Release retried after a lost reply: %v", err)
			}
		}
		if drop.dropped.Load() != 1 {
			t.Fatalf("no release reply dropped")
		}
		free(t, "release")
		noLeases(t)
	})
	t.Run("ClaimAfterBusy", func(t *testing.T) {
		// A claim whose reply is lost is answered busy on a retry with a new
		// owner token, and is undone by its own token.
		s := testenv.Hold(t, testenv.Context(t, 10*time.Second), b, "busy")
		if _, err := a.TryAcquire(testenv.Context(t, 10*time.Second), "busy"); !errors.Is(err, core.ErrNotAcquired) {
			t.Fatalf("TryAcquire of a held key = %v", err)
		}
		s.Release(context.Background())
		noLeases(t)
	})
	t.Run("Permit", func(t *testing.T) {
		// A permit claim applied but unanswered is undone: the semaphore
		// keeps all its permits free, and later claims see it right.
		drop.dropped.Store(0)
		drop.arm(isClaim)
		_, err := a.TryAcquire(testenv.Context(t, 10*time.Second), "permit", core.Limit(2))
		if err == nil || errors.Is(err, core.ErrNotAcquired) || drop.dropped.Load() != 1 {
			t.Fatalf("TryAcquire = %v, want a backend error (dropped %d)", err, drop.dropped.Load())
		}
		if hs, err := b.Holders(testenv.Context(t, 5*time.Second), "permit"); err != nil || len(hs) != 0 {
			t.Fatalf("holders after the undo: %+v, %v", hs, err)
		}
		noLeases(t)
		var ss []core.Session
		for _, l := range []*core.Client{a, b} {
			s, err := l.TryAcquire(testenv.Context(t, 5*time.Second), "permit", core.Limit(2))
			if err != nil {
				t.Fatalf("permit after the undo: %v", err)
			}
			ss = append(ss, s)
		}
		if _, err := a.TryAcquire(testenv.Context(t, 5*time.Second), "permit", core.Limit(2)); !errors.Is(err, core.ErrNotAcquired) {
			t.Fatalf("third permit of 2: %v", err)
		}
		for _, s := range ss {
			s.Release(context.Background())
		}
		noLeases(t)
	})
}
