package redislock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dislock/dislock/core"
	shared "github.com/dislock/dislock/internal/lane"
	"github.com/dislock/dislock/internal/testenv"
)

// pipelines records the size of each pipeline a client sends, and the
// kinds of the batch.lua calls in them.
type pipelines struct {
	mu       sync.Mutex
	sizes    []int
	combined []string // batch.lua's calls by SHA1
	bySource int      // and by source
}

func (p *pipelines) DialHook(next redis.DialHook) redis.DialHook { return next }
func (p *pipelines) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		p.mu.Lock()
		p.noteCombined(cmd)
		p.mu.Unlock()
		return next(ctx, cmd)
	}
}
func (p *pipelines) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		p.mu.Lock()
		if cmds[0].Name() == "incr" { // not the client's connection set-up
			p.sizes = append(p.sizes, len(cmds))
		}
		p.noteCombined(cmds...)
		p.mu.Unlock()
		return next(ctx, cmds)
	}
}

// noteCombined records the kinds of the batch.lua calls among cmds; p.mu
// is held.
func (p *pipelines) noteCombined(cmds ...redis.Cmder) {
	for _, c := range cmds {
		switch a := c.Args(); {
		case len(a) > 3 && a[1] == batchScript.sha:
			p.combined = append(p.combined, fmt.Sprint(a[3+a[2].(int)]))
		case len(a) > 3 && a[1] == batchScript.src:
			p.bySource++
		}
	}
}

func (p *pipelines) seen() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int(nil), p.sizes...)
}

// stalledLane is a lane over a client of the test server whose connections
// go through a StallProxy, with an admin client that goes around it.
func stalledLane(t *testing.T) (*lane, *testenv.StallProxy, *pipelines, *redis.Client) {
	t.Helper()
	c, p, seen, admin := stalledClient(t)
	l := newLane(c)
	t.Cleanup(l.close)
	return l, p, seen, admin
}

// stalledClient is a client of the test server whose connections go
// through a StallProxy, with an admin client that goes around it.
func stalledClient(t *testing.T) (*redis.Client, *testenv.StallProxy, *pipelines, *redis.Client) {
	t.Helper()
	opt, err := redis.ParseURL(testenv.Redis(t))
	if err != nil {
		t.Fatal(err)
	}
	admin := redis.NewClient(opt)
	t.Cleanup(func() { admin.Close() })
	p := testenv.NewStallProxy(t, opt.Network, opt.Addr)
	o := *opt
	o.Network, o.Addr = "tcp", p.Addr()
	// Connections open before the stall: a call is written at once, and
	// only its reply is held back.
	o.MinIdleConns = shared.MaxSenders + 1
	c := redis.NewClient(&o)
	t.Cleanup(func() { c.Close() })
	if !testenv.WaitFor(10*time.Second, func() bool { return c.PoolStats().IdleConns >= uint32(o.MinIdleConns) }) {
		t.Fatal("the client did not open its connections")
	}
	seen := &pipelines{}
	c.AddHook(seen)
	return c, p, seen, admin
}

// queuedLen is the length of l's queue.
func queuedLen(l *lane) int {
	_, n, _ := l.calls.State()
	return n
}

// occupy starts shared.MaxSenders calls made by call, one at a time, each taken
// by a sender of its own once ready reports true, which leaves l's senders
// all busy and its queue empty.
func occupy(t *testing.T, l *lane, call func(), ready func(i int) bool) {
	t.Helper()
	for i := 1; i <= shared.MaxSenders; i++ {
		go call()
		if !testenv.WaitFor(10*time.Second, func() bool {
			busy, queued, _ := l.calls.State()
			return busy == i && queued == 0 && ready(i)
		}) {
			t.Fatalf("the senders did not take call %d", i)
		}
	}
}

// Calls made while the lane's senders are all busy are sent together, in
// one pipeline, once a sender is free.
func TestLaneSharesRoundTrips(t *testing.T) {
	l, p, seen, admin := stalledLane(t)
	ctx := context.Background()
	key := testenv.Name("redislock-lane-")
	t.Cleanup(func() { admin.Del(context.Background(), key) })
	const calls = 20
	p.Stall()
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	call := func() {
		defer wg.Done()
		cmd := redis.NewIntCmd(ctx, "incr", key)
		if unsent, err := l.send(ctx, cmd, true, "", fastCall{}); unsent || err != nil {
			errs <- fmt.Errorf("send: unsent %v, %v", unsent, err)
			return
		}
		if err := cmd.Err(); err != nil {
			errs <- err
		}
	}
	wg.Add(calls)
	occupy(t, l, call, func(int) bool { return true })
	for range calls - shared.MaxSenders {
		go call()
	}
	if !testenv.WaitFor(10*time.Second, func() bool { return queuedLen(l) == calls-shared.MaxSenders }) {
		t.Fatalf("%d calls queued behind %d senders, want %d", queuedLen(l), shared.MaxSenders, calls-shared.MaxSenders)
	}
	p.Resume()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n, err := admin.Get(ctx, key).Int(); err != nil || n != calls {
		t.Fatalf("the server ran %d of %d calls (%v)", n, calls, err)
	}
	sizes := seen.seen()
	if len(sizes) != 1 || sizes[0] != calls-shared.MaxSenders {
		t.Fatalf("pipelines sent: %v, want one of the %d queued calls", sizes, calls-shared.MaxSenders)
	}
}

// A caller whose ctx ends while its call waits in the queue takes it out:
// it is never sent. A caller whose call was sent returns when its ctx ends,
// and the call still runs.
func TestLaneCallerLeaves(t *testing.T) {
	l, p, _, admin := stalledLane(t)
	key := testenv.Name("redislock-lane-")
	t.Cleanup(func() { admin.Del(context.Background(), key+":sent", key+":queued") })
	p.Stall()
	sent := make(chan error, shared.MaxSenders)
	occupy(t, l, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		unsent, err := l.send(ctx, redis.NewIntCmd(ctx, "incr", key+":sent"), true, "", fastCall{})
		if unsent {
			err = fmt.Errorf("a sent call reported unsent (%v)", err)
		}
		sent <- err
	}, func(int) bool { return true })
	ctx, cancel := context.WithCancel(context.Background())
	cut := time.AfterFunc(100*time.Millisecond, cancel)
	defer cut.Stop()
	cmd := redis.NewIntCmd(ctx, "incr", key+":queued")
	unsent, err := l.send(ctx, cmd, true, "", fastCall{})
	if !unsent || !errors.Is(err, context.Canceled) {
		t.Fatalf("a call that left the queue: unsent %v, %v; want unsent, context.Canceled", unsent, err)
	}
	for range shared.MaxSenders {
		if err := <-sent; !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a sent call whose ctx ended = %v, want context.DeadlineExceeded", err)
		}
	}
	p.Resume()
	ctx = context.Background()
	if !testenv.WaitFor(10*time.Second, func() bool { return admin.Get(ctx, key+":sent").Val() == fmt.Sprint(shared.MaxSenders) }) {
		t.Fatalf("the sent calls did not run after their callers left: %q", admin.Get(ctx, key+":sent").Val())
	}
	if n := admin.Exists(ctx, key+":queued").Val(); n != 0 {
		t.Fatal("the call that left the queue was sent")
	}
}

// Calls that could not get a connection, alone or in a batch, are reported
// as never sent.
func TestLaneNeverSent(t *testing.T) {
	release := make(chan struct{})
	var dials atomic.Int32
	c := redis.NewClient(&redis.Options{
		Addr: "127.0.0.1:1", MaxRetries: -1,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			<-release
			return nil, &net.OpError{Op: "dial", Net: network, Err: errors.New("refused")}
		},
	})
	t.Cleanup(func() { c.Close() })
	l := newLane(c)
	t.Cleanup(l.close)
	ctx := context.Background()
	const calls = 10
	var wg sync.WaitGroup
	var sent atomic.Int32
	call := func() {
		defer wg.Done()
		if unsent, err := l.send(ctx, redis.NewCmd(ctx, "ping"), true, "", fastCall{}); !unsent || err != nil {
			sent.Add(1)
		}
	}
	wg.Add(calls)
	occupy(t, l, call, func(i int) bool { return dials.Load() == int32(i) })
	for range calls - shared.MaxSenders {
		go call()
	}
	if !testenv.WaitFor(10*time.Second, func() bool { return queuedLen(l) == calls-shared.MaxSenders }) {
		t.Fatalf("%d calls queued, want %d", queuedLen(l), calls-shared.MaxSenders)
	}
	close(release)
	wg.Wait()
	if n := sent.Load(); n != 0 {
		t.Fatalf("%d of %d calls that got no connection were not reported as never sent", n, calls)
	}
}

// The common claims and releases of a batch go in one batch.lua call (also
// when the server has to be sent its source), and each gets the answer its
// own script would give: those that batch.lua
// leaves to their own scripts (a first try of a key held elsewhere, a
// release of a lease that is gone) too.
func TestLaneCombinesCommonCalls(t *testing.T) {
	c, p, seen, admin := stalledClient(t)
	prefix := testenv.Name("redislock-lane-")
	t.Cleanup(func() {
		ctx := context.Background()
		keys, _ := admin.Keys(ctx, prefix+":*").Result()
		if len(keys) > 0 {
			admin.Del(ctx, keys...)
		}
	})
	b, _, err := newBackend(c, []Option{WithPrefix(prefix)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	other, _, err := newBackend(admin, []Option{WithPrefix(prefix)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	claim := func(b *Backend, key, ot string) (core.Lease, error) {
		return b.TryAcquire(ctx, core.AcquireRequest{Key: key, OwnerToken: ot, Owner: "test", TTL: time.Minute})
	}
	held, err := claim(other, "held", "other")
	if err != nil {
		t.Fatal(err)
	}
	mine, err := claim(b, "mine", "mine")
	if err != nil {
		t.Fatal(err)
	}
	// The batch's script call is answered NOSCRIPT first, as after a
	// failover, and is sent again by source.
	if err := admin.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	p.Stall()
	l := b.lane
	occupied := make(chan error, shared.MaxSenders)
	var n atomic.Int32
	occupy(t, l, func() {
		i := n.Add(1)
		_, err := claim(b, fmt.Sprint("occupy-", i), fmt.Sprint("occupy-", i))
		occupied <- err
	}, func(int) bool { return true })
	type result struct {
		what  string
		lease core.Lease
		err   error
	}
	results := make(chan result, 8)
	calls := map[string]func() (core.Lease, error){
		"free-1": func() (core.Lease, error) { return claim(b, "free-1", "f1") },
		"free-2": func() (core.Lease, error) { return claim(b, "free-2", "f2") },
		"free-3": func() (core.Lease, error) { return claim(b, "free-3", "f3") },
		"held":   func() (core.Lease, error) { return claim(b, "held", "mine-too") },
		"release-mine": func() (core.Lease, error) {
			return core.Lease{}, b.Release(ctx, core.ReleaseRequest{Key: "mine", OwnerToken: "mine", Token: mine.Token})
		},
		"release-gone": func() (core.Lease, error) {
			return core.Lease{}, b.Release(ctx, core.ReleaseRequest{Key: "gone", OwnerToken: "gone", Token: 12345})
		},
	}
	for what, call := range calls {
		go func() {
			lease, err := call()
			results <- result{what, lease, err}
		}()
	}
	if !testenv.WaitFor(10*time.Second, func() bool { return queuedLen(l) == len(calls) }) {
		t.Fatalf("%d calls queued, want %d", queuedLen(l), len(calls))
	}
	p.Resume()
	for range shared.MaxSenders {
		if err := <-occupied; err != nil {
			t.Fatal(err)
		}
	}
	for range calls {
		r := <-results
		var busy *core.NotAcquiredError
		switch r.what {
		case "free-1", "free-2", "free-3":
			if r.err != nil || r.lease.Token == 0 {
				t.Errorf("%s: %+v, %v; want a lease", r.what, r.lease, r.err)
			}
		case "held":
			if !errors.As(r.err, &busy) || busy.Holder == nil || busy.Holder.Token != held.Token {
				t.Errorf("held: %v; want busy with the holder's token %d", r.err, held.Token)
			}
		case "release-mine":
			if r.err != nil {
				t.Errorf("release-mine: %v", r.err)
			}
		case "release-gone":
			if !errors.Is(r.err, core.ErrLeaseGone) {
				t.Errorf("release-gone: %v; want core.ErrLeaseGone", r.err)
			}
		}
	}
	if v, _ := admin.Get(ctx, b.lockKey("mine")).Result(); v != fmt.Sprintf("0|%d", mine.Token) {
		t.Errorf("the released lock's record is %q, want its tombstone", v)
	}
	seen.mu.Lock()
	defer seen.mu.Unlock()
	if len(seen.combined) != 1 || len(seen.combined[0]) != len(calls) || seen.bySource != 1 {
		t.Fatalf("batch.lua calls: %q, %d by source; want one of %d calls, sent again by source", seen.combined, seen.bySource, len(calls))
	}
}

// A release by the owner token of a claim whose caller left it on its way
// waits for that claim's answer (lane.after).
func TestLaneReleaseWaitsForLeftClaim(t *testing.T) {
	l, p, _, admin := stalledLane(t)
	key := testenv.Name("redislock-lane-")
	t.Cleanup(func() { admin.Del(context.Background(), key) })
	p.Stall()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if unsent, err := l.send(ctx, redis.NewIntCmd(ctx, "incr", key), true, "T", fastCall{}); unsent || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a claim left on its way: unsent %v, %v; want sent, context.DeadlineExceeded", unsent, err)
	}
	if err := l.after(context.Background(), "another"); err != nil {
		t.Fatalf("a release of another owner token waited: %v", err)
	}
	short, cancelShort := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancelShort()
	if err := l.after(short, "T"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a release of the left claim's owner token while it is on its way = %v, want to wait until its ctx ends", err)
	}
	waited := make(chan error, 1)
	go func() { waited <- l.after(context.Background(), "T") }()
	p.Resume()
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if n, err := admin.Get(context.Background(), key).Int(); err != nil || n != 1 {
		t.Fatalf("the left claim ran %d times (%v), want once before the release", n, err)
	}
	if _, _, n := l.calls.State(); n != 0 {
		t.Fatalf("%d owner tokens still pending", n)
	}
}
