package zklock_test

import (
	"context"
	"errors"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/internal/zktest"
	"github.com/dislock/dislock/zklock"
)

// attemptCounter counts the engine's claims (TryAcquire calls); the rest
// of the Backend, its queue included, is the embedded one.
type attemptCounter struct {
	*zklock.Backend
	n atomic.Int64
}

func (c *attemptCounter) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	c.n.Add(1)
	return c.Backend.TryAcquire(ctx, req)
}

// TestWaitersOfOneLockerWaitInLine: 64 goroutines of one Locker waiting for
// a key another of its sessions holds wait in the store's line instead of
// trying again and again (a key this backend holds is busy here without a
// request, which once made them spin), and each gets the key in turn after
// the release.
func TestWaitersOfOneLockerWaitInLine(t *testing.T) {
	t.Parallel()
	const waiters = 64
	b := &attemptCounter{Backend: newBackend(t, singleConnect(t), testRoot(), zklock.WithSessionTimeout(6*time.Second))}
	l, err := core.New(b, core.WithDefaults(core.TTL(b.MaxTTL())))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := ctxT(t, 60*time.Second)
	s, err := l.Acquire(ctx, "hot")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var got atomic.Int64
	errs := make(chan error, waiters)
	for range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w, err := l.Acquire(ctx, "hot")
			if err != nil {
				errs <- err
				return
			}
			got.Add(1)
			w.Release(context.Background())
		}()
	}
	if !testenv.WaitFor(20*time.Second, func() bool { return b.n.Load() >= waiters+1 }) {
		t.Fatalf("%d attempts, want each of the %d waiters' first and the holder's", b.n.Load(), waiters)
	}
	// Over a window shorter than a queued wait's refresh (a third of the
	// engine's 2 s queue TTL), the waiters in line make no attempt; a spin
	// makes thousands.
	n0 := b.n.Load()
	time.Sleep(300 * time.Millisecond)
	if n := b.n.Load() - n0; n > waiters {
		t.Errorf("%d attempts in 300 ms by %d waiters while the key was held, want at most %d", n, waiters, waiters)
	}
	if err := s.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got.Load() != waiters {
		t.Fatalf("%d of %d waiters got the key", got.Load(), waiters)
	}
	t.Logf("%d attempts for %d acquisitions", b.n.Load(), waiters+1)
}

// TestFirstUseOfAKeyCreatesItsContainerFirst: a claim of a key this backend
// never used creates the key's container node before the claim, so that the
// claim does not fail for the lack of it: two requests, not three.
func TestFirstUseOfAKeyCreatesItsContainerFirst(t *testing.T) {
	t.Parallel()
	var cnt counter
	b := newBackend(t, singleConnect(t), testRoot(), zklock.WithDialer(cnt.Dial))
	ctx := ctxT(t, 30*time.Second)
	acquire := func(key string) {
		t.Helper()
		req := core.AcquireRequest{Key: key, Owner: "t", OwnerToken: key + "-token", TTL: time.Second}
		if _, err := b.TryAcquire(ctx, req); err != nil {
			t.Fatal(err)
		}
		if err := b.Release(ctx, core.ReleaseRequest{Key: key, OwnerToken: req.OwnerToken}); err != nil {
			t.Fatal(err)
		}
	}
	acquire("first") // creates the root's nodes
	for _, key := range []string{"new", "new"} {
		n0 := cnt.Reqs.Load()
		acquire(key)
		if n := cnt.Reqs.Load() - n0; n > 3 {
			t.Errorf("acquire and release of key %q: %d requests, want at most 3", key, n)
		}
	}
}

// TestQueueGrantWithoutReadOnlyAfterTheNodeBefore: a waiter is granted
// without reading the line only when the one node before it, as its latest
// judgement found, is deleted. Here Y waits behind X (the holder) and V,
// and watches V. V leaves, and before Y acts on that event a fresh
// judgement finds X alone before it; the late event for V must not read as
// X's release.
func TestQueueGrantWithoutReadOnlyAfterTheNodeBefore(t *testing.T) {
	t.Parallel()
	connect, root := singleConnect(t), testRoot()
	bX, bV, bY := newBackend(t, connect, root), newBackend(t, connect, root), newBackend(t, connect, root)
	fired, resume, acted := make(chan string, 1), make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	zklock.SetWatchHook(bY, func(path string) func() {
		if !first.CompareAndSwap(false, true) {
			return func() {} // later watches (on X) act at once
		}
		fired <- path
		<-resume
		return func() { close(acted) }
	})
	lX, err := core.New(bX, core.WithDefaults(core.TTL(time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	defer lX.Close()
	ctx := ctxT(t, 30*time.Second)
	const key = "grant-without-read"
	sX, err := lX.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer sX.Release(context.Background())
	req := func(waiter string) core.AcquireRequest {
		return core.AcquireRequest{Key: key, Owner: waiter, OwnerToken: waiter + "-token", TTL: time.Second, Waiter: waiter, WaiterTTL: 30 * time.Second}
	}
	if _, err := bV.TryAcquire(ctx, req("v")); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("V's attempt: %v, want busy", err)
	}
	if _, err := bY.TryAcquire(ctx, req("y")); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("Y's attempt: %v, want busy", err)
	}
	if err := bV.Leave(ctx, key, "v"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-fired:
	case <-ctx.Done():
		t.Fatal("Y's watch on V did not fire when V left")
	}
	zklock.EvaluatePlace(bY, key, "y") // finds X alone before Y
	close(resume)
	<-acted
	if sX.Err() != nil {
		t.Fatalf("X lost the key: %v", sX.Err())
	}
	if _, err := bY.TryAcquire(ctx, req("y")); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("Y's attempt while X holds: %v, want busy (granted on V's deletion, with X before it)", err)
	}
}

// TestQueueNoGrantOnItsOwnDeletedNode: the nodes of a key are deleted
// behind the backends' backs, the waiter's own node first and then the
// holder's, the node just before it. The waiter must not take the deletion
// of the node before it for its turn on a node that is gone (the node after
// it would hold at the same time): it queues again, and its lease is a node
// of the store.
func TestQueueNoGrantOnItsOwnDeletedNode(t *testing.T) {
	t.Parallel()
	connect, root := singleConnect(t), testRoot()
	bX, bY := newBackend(t, connect, root), newBackend(t, connect, root)
	acted := make(chan struct{}, 4)
	zklock.SetWatchHook(bY, func(string) func() { return func() { acted <- struct{}{} } })
	ctx := ctxT(t, 30*time.Second)
	const key, ttl = "own-node-deleted", time.Second
	reqX := core.AcquireRequest{Key: key, Owner: "x", OwnerToken: "x-token", TTL: ttl}
	if _, err := bX.TryAcquire(ctx, reqX); err != nil {
		t.Fatal(err)
	}
	reqY := core.AcquireRequest{Key: key, Owner: "y", OwnerToken: "y-token", TTL: ttl, Waiter: "y", WaiterTTL: 30 * time.Second}
	if _, err := bY.TryAcquire(ctx, reqY); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("Y's attempt while X holds: %v, want busy", err)
	}
	raw := rawConn(t, connect)
	keys, _, err := raw.Children(root + "/locks")
	if err != nil || len(keys) != 1 {
		t.Fatalf("key containers: %v %v", keys, err)
	}
	parent := root + "/locks/" + keys[0]
	names, _, err := raw.Children(parent)
	if err != nil || len(names) != 2 {
		t.Fatalf("nodes of the key: %v %v, want X's and Y's", names, err)
	}
	sort.Slice(names, func(i, j int) bool { return names[i][len(names[i])-10:] < names[j][len(names[j])-10:] })
	for _, n := range []string{names[1], names[0]} { // Y's, then X's
		if err := raw.Delete(parent+"/"+n, -1); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-acted:
	case <-ctx.Done():
		t.Fatal("Y's watch on X's node did not fire")
	}
	ly, err := bY.TryAcquire(ctx, reqY)
	if err != nil {
		t.Fatalf("Y's attempt after both nodes went: %v, want the lease", err)
	}
	errs, err := bY.Renew(ctx, []core.RenewRequest{{Key: key, OwnerToken: reqY.OwnerToken, TTL: ttl}})
	if err != nil || errs[0] != nil {
		t.Fatalf("renewal of Y's lease: %v %v: granted on its deleted node", err, errs)
	}
	if err := bY.Release(ctx, core.ReleaseRequest{Key: key, OwnerToken: reqY.OwnerToken, Token: ly.Token}); err != nil {
		t.Fatal(err)
	}
}

// TestQueueExpiredPlaceSparesTheWaitsNewNode: the place of a wait whose
// first create went unanswered expires while the store is out of reach; its
// deletion looks for the node by the waiter's name. The wait's next
// attempt, made meanwhile, creates a node of that name and may be granted:
// the deletion must not take that node (the holder's lease) with it.
func TestQueueExpiredPlaceSparesTheWaitsNewNode(t *testing.T) {
	t.Parallel()
	b := newBackend(t, singleConnect(t), testRoot())
	deleting, resume, deleted := make(chan struct{}), make(chan struct{}), make(chan struct{})
	zklock.SetExpireHook(b, func() func() {
		close(deleting)
		<-resume
		return func() { close(deleted) }
	})
	ctx := ctxT(t, 30*time.Second)
	req := core.AcquireRequest{Key: "expired-place", Owner: "w", OwnerToken: "w-token", TTL: time.Second, Waiter: "w", WaiterTTL: 20 * time.Millisecond}
	zklock.UncertainPlace(b, req)
	select {
	case <-deleting:
	case <-ctx.Done():
		t.Fatal("the uncertain place did not expire")
	}
	next := req
	next.WaiterTTL = 30 * time.Second
	res := make(chan error, 1)
	go func() {
		_, err := b.TryAcquire(ctx, next)
		res <- err
	}()
	var err error
	got := false
	select {
	case err = <-res: // granted before the deletion ran: it must spare the node
		got = true
	case <-time.After(time.Second): // waits for the deletion
	}
	close(resume)
	<-deleted
	if !got {
		err = <-res
	}
	if err != nil {
		t.Fatalf("the wait's next attempt: %v", err)
	}
	errs, err := b.Renew(ctx, []core.RenewRequest{{Key: req.Key, OwnerToken: req.OwnerToken, TTL: time.Second}})
	if err != nil || errs[0] != nil {
		t.Fatalf("renewal of the lease just granted: %v %v: the expired place's deletion took its node", err, errs)
	}
}

// TestQueueTurnNeedsNoRoundTrip: a waiter whose place is the next in line
// gets the lease at its turn without waiting for the store: its place, the
// lowest node in force, holds from then on, and the rewrite that makes it a
// claim judged by its TTL goes out without the grant waiting for its reply.
// Here the store answers nothing to the waiter once its turn has come, and
// its grant must still return; the rewrite lands on the server meanwhile.
// The lease's token is the place's czxid, also for a place made by a plain
// create (a backend that knows the key busy: the multi that stamps a claim
// with the server's time is not needed), whose token comes with the read
// that watches it.
func TestQueueTurnNeedsNoRoundTrip(t *testing.T) {
	t.Parallel()
	for _, known := range []bool{false, true} {
		t.Run(map[bool]string{false: "first-attempt", true: "key-known-busy"}[known], func(t *testing.T) {
			t.Parallel()
			testTurnNeedsNoRoundTrip(t, known)
		})
	}
}

func testTurnNeedsNoRoundTrip(t *testing.T, known bool) {
	connect, root := singleConnect(t), testRoot()
	var wire wireLog
	bX, bY, proxy := behindProxy(t, connect, root, zklock.WithDialer(wire.dialer(0)))
	turn := make(chan struct{})
	var once sync.Once
	var armed atomic.Bool
	zklock.SetWatchHook(bY, func(string) func() {
		// The holder's node is gone: from here on the store's replies
		// to Y are held back. The turn is told once Y has acted on the
		// event (the returned func runs then), not when it arrives.
		done := func() {}
		if !armed.Load() {
			return done
		}
		once.Do(func() {
			proxy.StallOpen()
			done = func() { close(turn) }
		})
		return done
	})
	ctx := ctxT(t, 30*time.Second)
	const key, ttl = "turn-no-round-trip", time.Second
	reqX := core.AcquireRequest{Key: key, Owner: "x", OwnerToken: "x-token", TTL: ttl}
	lx, err := bX.TryAcquire(ctx, reqX)
	if err != nil {
		t.Fatal(err)
	}
	reqY := core.AcquireRequest{Key: key, Owner: "y", OwnerToken: "y-token", TTL: ttl, Waiter: "y", WaiterTTL: 30 * time.Second}
	if known {
		// An earlier wait of Y's on the key, given up: Y knows it busy.
		early := reqY
		early.Waiter, early.OwnerToken = "y0", "y0-token"
		if _, err := bY.TryAcquire(ctx, early); !errors.Is(err, core.ErrNotAcquired) {
			t.Fatalf("Y's earlier attempt while X holds: %v, want busy", err)
		}
		if err := bY.Leave(ctx, key, early.Waiter); err != nil {
			t.Fatal(err)
		}
	}
	wire.start()
	armed.Store(true)
	if _, err := bY.TryAcquire(ctx, reqY); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("Y's attempt while X holds: %v, want busy", err)
	}
	if known {
		count := wire.stopCounts()
		if count[opCreate] != 1 || count[opMulti] != 0 || count[opSetData] != 0 {
			t.Errorf("Y's place on a key it knows busy, writes by opcode: %v, want one create (%d), no multi (%d) and no setData (%d)",
				count, opCreate, opMulti, opSetData)
		}
	}
	if err := bX.Release(ctx, core.ReleaseRequest{Key: key, OwnerToken: reqX.OwnerToken, Token: lx.Token}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-turn:
	case <-ctx.Done():
		t.Fatal("Y's watch on X's node did not fire when X released")
	}
	gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	ly, err := bY.TryAcquire(gctx, reqY)
	cancel()
	if err != nil {
		t.Fatalf("Y's attempt at its turn, with the store's replies held back: %v, want the lease", err)
	}
	if ly.Token <= lx.Token {
		t.Fatalf("Y's token %d is not above X's %d", ly.Token, lx.Token)
	}
	// The rewrite reached the server although its reply did not come.
	raw := rawConn(t, connect)
	keys, _, err := raw.Children(root + "/locks")
	if err != nil || len(keys) != 1 {
		t.Fatalf("key containers: %v %v", keys, err)
	}
	parent := root + "/locks/" + keys[0]
	for {
		names, _, err := raw.Children(parent)
		if err != nil || len(names) != 1 {
			t.Fatalf("nodes of the key: %v %v, want Y's alone", names, err)
		}
		data, st, ch, err := raw.GetW(parent + "/" + names[0])
		if err != nil {
			t.Fatal(err)
		}
		if ly.Token != uint64(st.Czxid) {
			t.Fatalf("Y's token %d, want its node's czxid %d", ly.Token, st.Czxid)
		}
		if string(data) == string(zklock.ClaimData(ttl, "y")) {
			break
		}
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("Y's node still has %q, want claim data", data)
		}
	}
	proxy.Resume()
	errs, err := bY.Renew(ctx, []core.RenewRequest{{Key: key, OwnerToken: reqY.OwnerToken, TTL: ttl}})
	if err != nil || errs[0] != nil {
		t.Fatalf("renewal of Y's lease: %v %v", err, errs)
	}
	if err := bY.Release(ctx, core.ReleaseRequest{Key: key, OwnerToken: reqY.OwnerToken, Token: ly.Token}); err != nil {
		t.Fatal(err)
	}
}

// TestQueueNextBehindAGrant: a waiter whose place is behind a waiting
// place learns from that place's grant (a data change of the node it
// watches) that it is next. When that place is never kept (its waiter has
// no min hold), the grant tells it all: it sends nothing, and the child
// watch it armed on that node tells of its deletion. When the place may be
// kept, it reads that node (which watches it again, so that a keep's write
// before the deletion is seen), and no children. Either way it gets its
// turn at the next release and the lease without a read.
func TestQueueNextBehindAGrant(t *testing.T) {
	t.Parallel()
	for _, minHold := range []time.Duration{0, time.Minute} {
		t.Run(map[bool]string{true: "never-kept", false: "may-be-kept"}[minHold == 0], func(t *testing.T) {
			t.Parallel()
			testNextBehindAGrant(t, minHold)
		})
	}
}

func testNextBehindAGrant(t *testing.T, minHold time.Duration) {
	connect, root := singleConnect(t), testRoot()
	var wire wireLog
	bH, bX := newBackend(t, connect, root), newBackend(t, connect, root)
	bY := newBackend(t, connect, root, zklock.WithDialer(wire.dialer(0)))
	handled := make(chan struct{}, 4)
	zklock.SetWatchHook(bY, func(string) func() { return func() { handled <- struct{}{} } })
	ctx := ctxT(t, 30*time.Second)
	const key, ttl = "next-behind-a-grant", time.Second
	req := func(who string, wait bool) core.AcquireRequest { return ownerReq(key, who, ttl, minHold, wait) }
	lH, err := bH.TryAcquire(ctx, req("h", false))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		b   *zklock.Backend
		who string
	}{{bX, "x"}, {bY, "y"}} {
		if _, err := w.b.TryAcquire(ctx, req(w.who, true)); !errors.Is(err, core.ErrNotAcquired) {
			t.Fatalf("%s's attempt while H holds: %v, want busy", w.who, err)
		}
	}
	turns := watchTurns(t, ctx, bX, bY)
	wire.start()
	if err := bH.Release(ctx, core.ReleaseRequest{Key: key, OwnerToken: "h-token", Token: lH.Token}); err != nil {
		t.Fatal(err)
	}
	nextTurn(t, ctx, turns, "x")
	lX, err := bX.TryAcquire(ctx, req("x", true))
	if err != nil {
		t.Fatalf("X at its turn: %v", err)
	}
	select { // Y has acted on X's grant
	case <-handled:
	case <-ctx.Done():
		t.Fatal("Y's watch on X did not fire at X's grant")
	}
	var ops []int32
	for _, f := range wire.stop() {
		if f.write {
			ops = append(ops, f.op)
		}
	}
	if minHold == 0 && len(ops) != 0 {
		t.Fatalf("Y's requests after the grant of X, never kept: opcodes %v, want none", ops)
	}
	if minHold > 0 && (len(ops) != 1 || ops[0] != opGetData) {
		t.Fatalf("Y's requests after the grant of X, which may be kept: opcodes %v, want one getData (%d)", ops, opGetData)
	}
	if err := bX.Release(ctx, core.ReleaseRequest{Key: key, OwnerToken: "x-token", Token: lX.Token}); err != nil {
		t.Fatal(err)
	}
	nextTurn(t, ctx, turns, "y")
	wire.start()
	lY, err := bY.TryAcquire(ctx, req("y", true))
	for _, f := range wire.stop() {
		if f.write && f.op != opSetData {
			t.Errorf("Y's grant at its turn sent opcode %d, want only its rewrite (%d)", f.op, opSetData)
		}
	}
	if err != nil || lY.Token <= lX.Token {
		t.Fatalf("Y at its turn: %+v %v, want a token above X's %d", lY, err, lX.Token)
	}
}

// TestOwnWatchOnAGoneNode: the watch a waiting place keeps on its own node
// is one that a node already gone does not keep on the server (an exists
// watch would wait there for a creation that never comes to a sequential
// node, until the session ends). Not parallel: it counts the watches of
// the package's own server, which no other test uses meanwhile.
func TestOwnWatchOnAGoneNode(t *testing.T) {
	ens := ensemble(t, 1)
	connect := ens.Connect()
	b := newBackend(t, connect, testRoot())
	raw := rawConn(t, connect)
	ctx := ctxT(t, 30*time.Second)
	watches := func() int {
		t.Helper()
		out, err := zktest.FourLetter(ens.Nodes[0].Addr(), "mntr")
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(out) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "zk_watch_count"); ok {
				n, err := strconv.Atoi(strings.TrimSpace(v))
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
		}
		t.Fatalf("no zk_watch_count in mntr: %q", out)
		return 0
	}
	path := testRoot() + "-own"
	if _, err := raw.Create(path, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	before := watches()
	if !zklock.ArmOwn(ctx, b, path) {
		t.Fatal("own watch on an existing node: not armed")
	}
	if got := watches(); got != before+1 {
		t.Fatalf("server watches after the own watch on an existing node: %d, want %d", got, before+1)
	}
	if err := raw.Delete(path, -1); err != nil { // fires it
		t.Fatal(err)
	}
	if got := watches(); got != before {
		t.Fatalf("server watches after the node's deletion: %d, want %d", got, before)
	}
	if zklock.ArmOwn(ctx, b, path) {
		t.Fatal("own watch on a deleted node: armed")
	}
	if got := watches(); got != before {
		t.Errorf("server watches after the own watch on a deleted node: %d, want %d (a watch left waiting for the node's creation)", got, before)
	}
}

// TestQueueBusyKeepsDeadline: a waiting attempt that finds the key busy
// watches its place within its caller's ctx. Here the store's replies to
// the waiter are held back from the moment its place is judged, after the
// store's busy answer: the attempt returns busy at its ctx's end, not when
// the backend's own bound or the session's receive timeout runs out.
func TestQueueBusyKeepsDeadline(t *testing.T) {
	t.Parallel()
	connect, root := singleConnect(t), testRoot()
	// A long session for Y: the client drops a stalled connection only
	// after two thirds of it.
	bX, bY, proxy := behindProxy(t, connect, root, zklock.WithSessionTimeout(15*time.Second))
	var once sync.Once
	zklock.SetEvaluateHook(bY, func() { once.Do(proxy.StallOpen) })
	ctx := ctxT(t, 30*time.Second)
	const key, ttl = "busy-keeps-deadline", time.Second
	if _, err := bX.TryAcquire(ctx, core.AcquireRequest{Key: key, Owner: "x", OwnerToken: "x-token", TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	const d = 200 * time.Millisecond
	yctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	start := time.Now()
	_, err := bY.TryAcquire(yctx, core.AcquireRequest{Key: key, Owner: "y", OwnerToken: "y-token", TTL: ttl, Waiter: "y", WaiterTTL: 30 * time.Second})
	took := time.Since(start)
	proxy.Resume()
	if !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("Y's attempt while X holds: %v, want busy", err)
	}
	// Without the caller's ctx, the watches' calls wait 10 s for replies
	// held back (the client's receive timeout is 10 s as well).
	if took > d+3*time.Second {
		t.Fatalf("Y's attempt with a %v ctx returned after %v", d, took)
	}
}

// behindProxy returns two backends on connect under root: X, and Y, whose
// replies the StallProxy it also returns can hold back; opts are Y's.
func behindProxy(t *testing.T, connect, root string, opts ...zklock.Option) (x, y *zklock.Backend, proxy *testenv.StallProxy) {
	t.Helper()
	servers, chroot, err := zklock.ParseServers(connect)
	if err != nil {
		t.Fatal(err)
	}
	proxy = testenv.NewStallProxy(t, "tcp", servers[0])
	return newBackend(t, connect, root), newBackend(t, proxy.Addr()+chroot, root, opts...), proxy
}

// TestQueueBackPlaceReadsNoHolder: a waiting attempt whose place is behind
// another waiting place creates its node, reads the children, and watches
// the node before its own (its data and its deletion) and its own node:
// it does not read the holder (the place right behind the holder judges
// it), and its busy answer names no holder. When the place before it leaves, it is next: its next attempt
// reads the holder and names it.
func TestQueueBackPlaceReadsNoHolder(t *testing.T) {
	t.Parallel()
	connect, root := singleConnect(t), testRoot()
	var wire wireLog
	// Sessions long enough for a lease that outlasts the test on a slow
	// machine (no engine renews it here).
	long := zklock.WithSessionTimeout(30 * time.Second)
	bH, bX := newBackend(t, connect, root, long), newBackend(t, connect, root, long)
	bY := newBackend(t, connect, root, long, zklock.WithDialer(wire.dialer(0)))
	handled := make(chan struct{}, 4)
	zklock.SetWatchHook(bY, func(string) func() { return func() { handled <- struct{}{} } })
	ctx := ctxT(t, 30*time.Second)
	const key, ttl = "back-place-reads-no-holder", 15 * time.Second
	req := func(who string) core.AcquireRequest {
		return core.AcquireRequest{Key: key, Owner: who, OwnerToken: who + "-token", TTL: ttl, Waiter: who, WaiterTTL: 30 * time.Second}
	}
	if _, err := bH.TryAcquire(ctx, core.AcquireRequest{Key: key, Owner: "h", OwnerToken: "h-token", TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	if _, err := bX.TryAcquire(ctx, req("x")); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("X's attempt while H holds: %v, want busy", err)
	}
	wire.start()
	_, err := bY.TryAcquire(ctx, req("y"))
	var na *core.NotAcquiredError
	if !errors.As(err, &na) {
		t.Fatalf("Y's waiting attempt behind X: %v, want busy", err)
	}
	if na.Holder != nil {
		t.Errorf("Y's busy answer behind X names a holder: %+v, want none (not read)", na.Holder)
	}
	count := wire.stopCounts()
	// (A claim of Y's: a multi, and a rewrite as a waiting place when the
	// backend did not yet know the key busy.)
	if count[opGetData] != 2 || count[opGetChildren2] != 2 || count[opExists] != 0 {
		t.Errorf("Y's requests behind X, by opcode: %v, want two getData (%d: X's node and its own), two getChildren2 (%d: the key's, and X's for its deletion) and no exists (%d)",
			count, opGetData, opGetChildren2, opExists)
	}
	if err := bX.Leave(ctx, key, "x"); err != nil {
		t.Fatal(err)
	}
	select { // Y has acted on X's deletion: it is next behind H
	case <-handled:
	case <-ctx.Done():
		t.Fatal("Y's watch on X did not fire at X's deletion")
	}
	_, err = bY.TryAcquire(ctx, req("y"))
	if !errors.As(err, &na) {
		t.Fatalf("Y's attempt next behind H: %v, want busy", err)
	}
	if na.Holder == nil || na.Holder.Owner != "h" || na.Holder.Remaining <= 0 {
		t.Fatalf("Y's busy answer next behind H: %+v, want H with time left", na.Holder)
	}
}

// TestQueueKeptAfterAQueuedGrant: a waiter whose holder was itself a
// waiting place with a min hold, and whose release keeps the lock, stays
// out until the hold ends: its watch on that holder's node sees the keep's
// write before the deletion (its place said it may be kept), and the child
// watch on the node does not tell of the deletion as a turn.
func TestQueueKeptAfterAQueuedGrant(t *testing.T) {
	t.Parallel()
	connect, root := singleConnect(t), testRoot()
	bH, bX, bY := newBackend(t, connect, root), newBackend(t, connect, root), newBackend(t, connect, root)
	acted := make(chan string, 16)
	zklock.SetWatchHook(bY, func(p string) func() { return func() { acted <- p } })
	ctx := ctxT(t, 30*time.Second)
	const key, ttl = "kept-after-a-queued-grant", time.Second
	req := func(who string, wait bool, minHold time.Duration) core.AcquireRequest {
		return ownerReq(key, who, ttl, minHold, wait)
	}
	lH, err := bH.TryAcquire(ctx, req("h", false, 0))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bX.TryAcquire(ctx, req("x", true, time.Minute)); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("X's attempt while H holds: %v, want busy", err)
	}
	if _, err := bY.TryAcquire(ctx, req("y", true, 0)); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("Y's attempt behind X: %v, want busy", err)
	}
	turns := watchTurns(t, ctx, bX, bY)
	if err := bH.Release(ctx, core.ReleaseRequest{Key: key, OwnerToken: "h-token", Token: lH.Token}); err != nil {
		t.Fatal(err)
	}
	nextTurn(t, ctx, turns, "x")
	lX, err := bX.TryAcquire(ctx, req("x", true, time.Minute))
	if err != nil {
		t.Fatalf("X at its turn: %v", err)
	}
	xNode := func() string {
		t.Helper()
		for {
			select {
			case p := <-acted: // Y has acted on X's grant
				if strings.Contains(path.Base(p), "-x-") {
					return p
				}
			case <-ctx.Done():
				t.Fatal("Y's watch on X did not fire at X's grant")
			}
		}
	}()
	if err := bX.Release(ctx, core.ReleaseRequest{Key: key, OwnerToken: "x-token", Token: lX.Token, Keep: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	select { // Y has acted on the keep
	case p := <-acted:
		if p != xNode {
			t.Fatalf("Y acted on %s, want X's node %s", p, xNode)
		}
	case <-ctx.Done():
		t.Fatal("Y's watch on X did not fire at X's keep")
	}
	select {
	case got := <-turns:
		t.Fatalf("turn of %q while X's release keeps the lock", got)
	default:
	}
	_, err = bY.TryAcquire(ctx, req("y", true, 0))
	var na *core.NotAcquiredError
	if !errors.As(err, &na) {
		t.Fatalf("Y's attempt while X's release keeps the lock: %v, want busy", err)
	}
}

// ownerReq is an AcquireRequest of key by owner who (owner token who +
// "-token"), waiting in line as waiter who when wait (WaiterTTL 30 s).
func ownerReq(key, who string, ttl, minHold time.Duration, wait bool) core.AcquireRequest {
	r := core.AcquireRequest{Key: key, Owner: who, OwnerToken: who + "-token", TTL: ttl, MinHold: minHold}
	if wait {
		r.Waiter, r.WaiterTTL = who, 30*time.Second
	}
	return r
}

// watchTurns subscribes to the turns of the waiters of bs (WatchTurns) and
// returns them, once every subscription is in place.
func watchTurns(t *testing.T, ctx context.Context, bs ...*zklock.Backend) <-chan string {
	t.Helper()
	turns, ready := make(chan string, 16), make(chan struct{}, len(bs))
	for _, b := range bs {
		go b.WatchTurns(ctx, func() { ready <- struct{}{} }, func(_, waiter string) { turns <- waiter })
	}
	for range bs {
		select {
		case <-ready:
		case <-ctx.Done():
			t.Fatal("the turn subscriptions did not start")
		}
	}
	return turns
}

// nextTurn fails unless the next turn told is want's.
func nextTurn(t *testing.T, ctx context.Context, turns <-chan string, want string) {
	t.Helper()
	select {
	case got := <-turns:
		if got != want {
			t.Fatalf("turn of %q, want %q", got, want)
		}
	case <-ctx.Done():
		t.Fatalf("no turn for %q", want)
	}
}

// takeThenPassOn has waiter y of b take the key at its turn, and release
// it with waiter z behind it; it fails unless the next turn told is z's (a
// turn of y's told twice would come first).
func takeThenPassOn(t *testing.T, ctx context.Context, b *zklock.Backend, turns <-chan string, req func(who string, wait bool) core.AcquireRequest) {
	t.Helper()
	lY, err := b.TryAcquire(ctx, req("y", true))
	if err != nil {
		t.Fatalf("Y at its turn: %v", err)
	}
	if _, err := b.TryAcquire(ctx, req("z", true)); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("Z's attempt while Y holds: %v, want busy", err)
	}
	if err := b.Release(ctx, core.ReleaseRequest{Key: req("y", true).Key, OwnerToken: "y-token", Token: lY.Token}); err != nil {
		t.Fatal(err)
	}
	nextTurn(t, ctx, turns, "z")
}

// TestQueueArmRacesTheNodeBefore: a waiting place arms a data watch and a
// child watch on the node before it, in two requests; that node may change
// or go between them. The place is told its turn once, whichever watch the
// store armed: a second turn would be one behind at every turn after.
//   - deleted: the holder released between the two requests; the data
//     watch, armed while the node stood, reports the deletion alone.
//   - granted-then-deleted: the waiting place before it was granted and
//     released between them; the data watch reports the grant, and the
//     deletion, which no child watch reports, is still its turn.
func TestQueueArmRacesTheNodeBefore(t *testing.T) {
	t.Parallel()
	for _, granted := range []bool{false, true} {
		t.Run(map[bool]string{false: "deleted", true: "granted-then-deleted"}[granted], func(t *testing.T) {
			t.Parallel()
			testArmRacesTheNodeBefore(t, granted)
		})
	}
}

func testArmRacesTheNodeBefore(t *testing.T, granted bool) {
	connect, root := singleConnect(t), testRoot()
	bH, bX, bY := newBackend(t, connect, root), newBackend(t, connect, root), newBackend(t, connect, root)
	ctx := ctxT(t, 30*time.Second)
	key := "arm-races-the-node-before-" + strconv.FormatBool(granted)
	const ttl = time.Second
	req := func(who string, wait bool) core.AcquireRequest { return ownerReq(key, who, ttl, 0, wait) }
	lH, err := bH.TryAcquire(ctx, req("h", false))
	if err != nil {
		t.Fatal(err)
	}
	if granted {
		if _, err := bX.TryAcquire(ctx, req("x", true)); !errors.Is(err, core.ErrNotAcquired) {
			t.Fatalf("X's attempt while H holds: %v, want busy", err)
		}
	}
	turns := watchTurns(t, ctx, bX, bY)
	// Y's places are judged at their attempts and, in granted-then-deleted,
	// once more when the grant's read finds X's node gone: a judgement
	// more, started by the arming, may tell Y's turn again, unless Y's
	// grant ended its place first.
	var judged atomic.Int64
	zklock.SetEvaluateHook(bY, func() { judged.Add(1) })
	// (Told as the event fires: Y acts on it once its judgement, waiting
	// in the hook below, is done.)
	fired := make(chan string, 16)
	zklock.SetWatchHook(bY, func(p string) func() { fired <- p; return func() {} })
	// Y's first arming on the node before it: the child watch waits for
	// the data watch's answer, then the node changes and goes.
	// The watch on Y's own node is armed first too: a deletion reported
	// before it is, is judged again (and told once).
	var firstChild atomic.Bool
	armed := make(chan string, 16)
	zklock.SetArmHook(bY, func(p string, data bool) func() {
		if data {
			return func() {
				select {
				case armed <- path.Base(p):
				default: // (only the first few are waited for)
				}
			}
		}
		if !firstChild.CompareAndSwap(false, true) {
			return func() {}
		}
		for own, before := false, false; !own || !before; {
			select {
			case n := <-armed:
				own = own || strings.Contains(n, "-y-")
				before = before || !strings.Contains(n, "-y-")
			case <-ctx.Done():
				t.Error("Y's data watches were not armed")
				return func() {}
			}
		}
		if !granted {
			if err := bH.Release(ctx, core.ReleaseRequest{Key: key, OwnerToken: "h-token", Token: lH.Token}); err != nil {
				t.Error(err)
			}
			return func() {}
		}
		if err := bH.Release(ctx, core.ReleaseRequest{Key: key, OwnerToken: "h-token", Token: lH.Token}); err != nil {
			t.Error(err)
		}
		if got := <-turns; got != "x" {
			t.Errorf("turn of %q, want x's", got)
		}
		lX, err := bX.TryAcquire(ctx, req("x", true))
		if err != nil {
			t.Errorf("X at its turn: %v", err)
			return func() {}
		}
		select {
		case <-fired:
		case <-ctx.Done():
			t.Error("Y's watch on X did not fire at X's grant")
		}
		if err := bX.Release(ctx, core.ReleaseRequest{Key: key, OwnerToken: "x-token", Token: lX.Token}); err != nil {
			t.Error(err)
		}
		return func() {}
	})
	if _, err := bY.TryAcquire(ctx, req("y", true)); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("Y's attempt behind the node before it: %v, want busy", err)
	}
	nextTurn(t, ctx, turns, "y")
	takeThenPassOn(t, ctx, bY, turns, req)
	bY.Close() // every judgement of Y's places is over
	want := map[bool]int64{false: 2, true: 3}[granted]
	if got := judged.Load(); got != want {
		t.Errorf("Y's places (y, then z) were judged %d times, want %d", got, want)
	}
}

// TestQueueTurnToldOnce: a place told its turn is not told again until its
// waiter tries: a judgement that finds it first once more (one under way as
// a watch fired, say) tells nothing, and the turn after is the next
// waiter's.
func TestQueueTurnToldOnce(t *testing.T) {
	t.Parallel()
	connect, root := singleConnect(t), testRoot()
	bH, bY := newBackend(t, connect, root), newBackend(t, connect, root)
	ctx := ctxT(t, 30*time.Second)
	const key, ttl = "turn-told-once", time.Second
	req := func(who string, wait bool) core.AcquireRequest { return ownerReq(key, who, ttl, 0, wait) }
	lH, err := bH.TryAcquire(ctx, req("h", false))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bY.TryAcquire(ctx, req("y", true)); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("Y's attempt while H holds: %v, want busy", err)
	}
	turns := watchTurns(t, ctx, bY)
	if err := bH.Release(ctx, core.ReleaseRequest{Key: key, OwnerToken: "h-token", Token: lH.Token}); err != nil {
		t.Fatal(err)
	}
	nextTurn(t, ctx, turns, "y")
	// (Turns are told synchronously, within the judgement.)
	zklock.EvaluatePlace(bY, key, "y")
	select {
	case got := <-turns:
		t.Fatalf("turn of %q again before its waiter tried", got)
	default:
	}
	takeThenPassOn(t, ctx, bY, turns, req)
}

// TestQueueTurnToldOnTheReceiveLoop: a waiting place behind a waiting
// place that is never kept learns that it is next from that place's grant,
// and its turn from its deletion, as the events arrive on the session's
// receive loop: not from the goroutines that follow the watches, which are
// held up here from the start. The turn is told once.
func TestQueueTurnToldOnTheReceiveLoop(t *testing.T) {
	t.Parallel()
	connect, root := singleConnect(t), testRoot()
	bX, bV, bY := newBackend(t, connect, root), newBackend(t, connect, root), newBackend(t, connect, root)
	unstall := make(chan struct{})
	var once sync.Once
	resume := func() { once.Do(func() { close(unstall) }) }
	defer resume()
	zklock.SetWatchHook(bY, func(string) func() {
		<-unstall // Y's watches' goroutines act on nothing until then
		return func() {}
	})
	ctx := ctxT(t, 30*time.Second)
	const key, ttl = "turn-on-receive-loop", time.Second
	req := func(who string, wait bool) core.AcquireRequest { return ownerReq(key, who, ttl, 0, wait) }
	lX, err := bX.TryAcquire(ctx, req("x", false))
	if err != nil {
		t.Fatal(err)
	}
	turnsV, turnsY := watchTurns(t, ctx, bV), watchTurns(t, ctx, bY)
	if _, err := bV.TryAcquire(ctx, req("v", true)); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("V's attempt while X holds: %v, want busy", err)
	}
	if _, err := bY.TryAcquire(ctx, req("y", true)); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("Y's attempt while X holds: %v, want busy", err)
	}
	if err := bX.Release(ctx, core.ReleaseRequest{Key: key, OwnerToken: "x-token", Token: lX.Token}); err != nil {
		t.Fatal(err)
	}
	nextTurn(t, ctx, turnsV, "v")
	// V's grant rewrites its node, which is first now; its release, sent
	// once the rewrite has landed, deletes it.
	raw := rawConn(t, connect)
	names, _, err := raw.Children(bV.KeyPath(key))
	if err != nil || len(names) != 2 {
		t.Fatalf("the key's nodes: %v %v, want V's and Y's", names, err)
	}
	sort.Slice(names, func(i, j int) bool { return names[i][len(names[i])-10:] < names[j][len(names[j])-10:] })
	_, _, rewritten, err := raw.GetW(bV.KeyPath(key) + "/" + names[0])
	if err != nil {
		t.Fatal(err)
	}
	lV, err := bV.TryAcquire(ctx, req("v", true))
	if err != nil {
		t.Fatalf("V at its turn: %v", err)
	}
	select {
	case ev := <-rewritten:
		if ev.Type != zk.EventNodeDataChanged {
			t.Fatalf("V's node after its grant: %v, want its data changed", ev.Type)
		}
	case <-ctx.Done():
		t.Fatal("V's grant did not rewrite its node")
	}
	if err := bV.Release(ctx, core.ReleaseRequest{Key: key, OwnerToken: "v-token", Token: lV.Token}); err != nil {
		t.Fatal(err)
	}
	nextTurn(t, ctx, turnsY, "y")
	resume()
	takeThenPassOn(t, ctx, bY, turnsY, req)
}
