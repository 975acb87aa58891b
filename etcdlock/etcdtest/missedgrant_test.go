package etcdtest_test

import (
	"bytes"
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/etcdlock/etcdtest"
	"github.com/dislock/dislock/internal/testenv"
)

// TestGrantMissedByTheWatch: a release grants the key to a waiter whose
// Locker's watch does not report it (the watch was not running then: a lost
// leader ends it). The waiter's next attempt finds the key granted to it
// and takes it, with the grant's revision as its token, instead of
// answering busy until the grant's lease runs out (which its own attempts
// keep alive).
//   - missed: the grant's event never comes.
//   - late: it comes after the attempt took the key; the Locker keeps the
//     lock it holds (a grant to a waiter that no longer waits is deleted
//     otherwise).
func TestGrantMissedByTheWatch(t *testing.T) {
	c := etcdtest.Start(t, 1)
	for _, late := range []bool{false, true} {
		t.Run(map[bool]string{false: "missed", true: "late"}[late], func(t *testing.T) {
			// A release grants the key when its Locker's watch has seen
			// the waiter's place with the lease to bind the key to; a round
			// whose release freed the key instead is played again.
			for range 5 {
				if grantMissed(t, c, late) || t.Failed() {
					return
				}
			}
			t.Fatal("no release of 5 granted the key to the waiter")
		})
	}
}

// grantMissed plays one round, and reports whether its release granted
// the key.
func grantMissed(t *testing.T, c *etcdtest.Cluster, late bool) bool {
	prefix := uniquePrefix("missed-grant")
	admin := c.Client(t)
	ctx := testenv.Context(t, 30*time.Second)
	// The waiter's client holds back the grant's event, and counts the
	// transactions it sends that may delete the key.
	var deletes atomic.Int64
	lockKey := []byte(prefix + "k")
	cli := etcdtest.NewClient(t, clientv3.Config{Endpoints: c.Endpoints(), DialOptions: []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if r, ok := req.(*pb.TxnRequest); ok && deletesKey(r, lockKey) {
				deletes.Add(1)
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
	}})
	w := &holdBack{Watcher: cli.Watcher, inject: make(chan *clientv3.Event), held: make(chan *clientv3.Event, 1), sent: make(chan struct{}),
		match: func(ev *clientv3.Event) bool {
			return ev.Type == mvccpb.PUT && bytes.Equal(ev.Kv.Key, lockKey) && bytes.Contains(ev.Kv.Value, []byte(`"grant"`))
		}}
	cli.Watcher = w
	waiter := newLocker(t, cli, prefix)
	got := make(chan core.Session, 1)
	s := grantingHolder(t, ctx, c, prefix, "k", func() {
		go func() {
			ws, err := waiter.Acquire(ctx, "k", core.Backoff(200*time.Millisecond, 200*time.Millisecond))
			if err != nil {
				t.Error(err)
			}
			got <- ws
		}()
	})
	if err := s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var grant *clientv3.Event
	select {
	case grant = <-w.held:
	case ws := <-got: // freed, not granted: the waiter claimed it
		if ws != nil {
			ws.Release(ctx)
		}
		return false
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter got nothing within 10s of the release")
	}
	var ws core.Session
	select {
	case ws = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not take the key granted to it within 10s, its watch silent")
	}
	if ws == nil {
		t.FailNow()
	}
	defer ws.Release(ctx)
	if ws.Token() != uint64(grant.Kv.ModRevision) {
		t.Errorf("the waiter's token %d, want the grant's revision %d", ws.Token(), grant.Kv.ModRevision)
	}
	if resp, err := admin.Get(ctx, prefix+"\x00q\x00k\x00", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		t.Fatal(err)
	} else if !testenv.WaitFor(5*time.Second, func() bool {
		resp, err = admin.Get(ctx, prefix+"\x00q\x00k\x00", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == 0
	}) {
		t.Errorf("k's line holds %d waiters after the waiter took the key, want none", resp.Count)
	}
	if !late {
		return true
	}
	// The marker, an event of no key of the Locker's, is taken once the
	// grant's event was acted on.
	marker := &clientv3.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte("unrelated"), ModRevision: grant.Kv.ModRevision}}
	for _, ev := range []*clientv3.Event{grant, marker} {
		w.inject <- ev
		<-w.sent
	}
	// The Locker holds the key at the grant's revision: still there, and
	// no transaction of the waiter's client deleted it.
	resp, err := admin.Get(ctx, prefix+"k")
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].ModRevision != grant.Kv.ModRevision {
		t.Fatalf("the key after the grant's late event: %v %v, want it held at the grant's revision", resp, err)
	}
	if err := ws.Release(ctx); err != nil {
		t.Errorf("the release after the grant's late event: %v", err)
	}
	if n := deletes.Load(); n != 1 {
		t.Errorf("the waiter's client sent %d transactions deleting the key, want 1: its release", n)
	}
	return true
}

// deletesKey reports whether transaction r, or one nested in it, may delete
// key.
func deletesKey(r *pb.TxnRequest, key []byte) bool {
	for _, op := range append(slices.Clone(r.Success), r.Failure...) {
		if d := op.GetRequestDeleteRange(); d != nil && bytes.Equal(d.Key, key) {
			return true
		}
		if n := op.GetRequestTxn(); n != nil && deletesKey(n, key) {
			return true
		}
	}
	return false
}

// holdBack is a Watcher whose watches hold back the events that match
// (to held), and pass on those injected, each in a response of its own,
// telling sent once its response was taken.
type holdBack struct {
	clientv3.Watcher
	match  func(*clientv3.Event) bool
	held   chan *clientv3.Event
	inject chan *clientv3.Event
	sent   chan struct{}
}

func (w *holdBack) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	in := w.Watcher.Watch(ctx, key, opts...)
	out := make(chan clientv3.WatchResponse)
	go func() {
		defer close(out)
		for {
			var resp clientv3.WatchResponse
			select {
			case r, ok := <-in:
				if !ok {
					return
				}
				resp = r
				kept := make([]*clientv3.Event, 0, len(r.Events))
				for _, ev := range r.Events {
					if w.match(ev) {
						w.held <- ev
						continue
					}
					kept = append(kept, ev)
				}
				resp.Events = kept
			case ev := <-w.inject:
				select {
				case out <- clientv3.WatchResponse{Events: []*clientv3.Event{ev}}:
					w.sent <- struct{}{}
				case <-ctx.Done():
					return
				}
				continue
			case <-ctx.Done():
				return
			}
			select {
			case out <- resp:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// actedOn is a Watcher that closes created once its watch is created, and
// done once it has handed over a response with an event that matches and
// the Locker reading it has acted on it (it took the empty response sent
// after it).
type actedOn struct {
	clientv3.Watcher
	match         func(*clientv3.Event) bool
	created, done chan struct{}
	once, once2   sync.Once
}

func newActedOn(w clientv3.Watcher, match func(*clientv3.Event) bool) *actedOn {
	return &actedOn{Watcher: w, match: match, created: make(chan struct{}), done: make(chan struct{})}
}

func (w *actedOn) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	in := w.Watcher.Watch(ctx, key, opts...)
	out := make(chan clientv3.WatchResponse)
	go func() {
		defer close(out)
		for resp := range in {
			select {
			case out <- resp:
			case <-ctx.Done():
				return
			}
			if resp.Created {
				w.once2.Do(func() { close(w.created) })
			}
			if !slices.ContainsFunc(resp.Events, w.match) {
				continue
			}
			select {
			case out <- clientv3.WatchResponse{}:
				w.once.Do(func() { close(w.done) })
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// waiterSeen makes cli's Watcher an actedOn that is done once the Locker
// on cli has acted on the creation of a waiter key of key under prefix
// (its watch knows that waiter's place: its release grants it the key).
func waiterSeen(cli *clientv3.Client, prefix, key string) *actedOn {
	line := []byte(prefix + "\x00q\x00" + key + "\x00")
	w := newActedOn(cli.Watcher, func(ev *clientv3.Event) bool {
		return ev.Type == mvccpb.PUT && ev.IsCreate() && bytes.HasPrefix(ev.Kv.Key, line)
	})
	cli.Watcher = w
	return w
}

// grantingHolder holds key through a Locker on a client of c whose watch
// follows the lines under prefix (it waits on key+"-other", held by
// another Locker), and returns the session once that Locker has seen a
// waiter queue on key (wait starts the waiter): its release grants key to
// that waiter.
func grantingHolder(t *testing.T, ctx context.Context, c *etcdtest.Cluster, prefix, key string, wait func()) core.Session {
	t.Helper()
	hcli := c.Client(t)
	seen := waiterSeen(hcli, prefix, key)
	holder, third := newLocker(t, hcli, prefix), newLocker(t, c.Client(t), prefix)
	s := testenv.Hold(t, ctx, holder, key)
	o := testenv.Hold(t, ctx, third, key+"-other")
	t.Cleanup(func() { o.Release(context.Background()) })
	go func() {
		if s, err := holder.Acquire(ctx, key+"-other"); err == nil {
			s.Release(ctx)
		}
	}()
	for _, ch := range []chan struct{}{seen.created, seen.done} {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatal("the holder's Locker did not watch, or see the waiter queue, within 10s")
		}
		if ch == seen.created {
			wait()
		}
	}
	return s
}
