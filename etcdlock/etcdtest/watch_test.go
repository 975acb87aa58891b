package etcdtest_test

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/namespace"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/etcdlock"
	"github.com/dislock/dislock/etcdlock/etcdtest"
	"github.com/dislock/dislock/internal/testenv"
)

// TestWatchReadsItsOwnStream: a waiter's Locker on a client whose Watcher
// is clientv3's reads its watch as one gRPC stream of its own, with none
// of clientv3's Watcher goroutines between the stream and the Locker;
// on a client whose Watcher wraps clientv3's (a namespace), the watch goes
// through the wrapper. Either way the waiter is told its turn. (Not
// parallel: it reads every goroutine's stack.)
func TestWatchReadsItsOwnStream(t *testing.T) {
	c := etcdtest.Start(t, 1)
	for _, wrapped := range []bool{false, true} {
		t.Run(map[bool]string{false: "clientv3", true: "wrapped"}[wrapped], func(t *testing.T) {
			prefix := uniquePrefix("own-stream")
			var cnt etcdtest.Counter
			cli := etcdtest.NewClient(t, clientv3.Config{Endpoints: c.Endpoints(), DialOptions: cnt.DialOptions()})
			if wrapped {
				cli.Watcher = namespace.NewWatcher(cli.Watcher, "")
			}
			holder, waiter := newLocker(t, c.Client(t), prefix), newLocker(t, cli, prefix)
			ctx := testenv.Context(t, 20*time.Second)
			s := testenv.Hold(t, ctx, holder, "k")
			got := make(chan error, 1)
			go func() {
				// Polls every 20 s: only the watch tells it in time.
				w, err := waiter.Acquire(ctx, "k", core.Backoff(20*time.Second, 20*time.Second))
				if err == nil {
					err = w.Release(ctx)
				}
				got <- err
			}()
			if !testenv.WaitFor(10*time.Second, func() bool { return cnt.Watches.Load() > 0 }) {
				t.Fatal("the waiter's watch not up within 10s")
			}
			if n := clientWatchers(); (n > 0) != wrapped {
				t.Errorf("goroutines of clientv3's Watcher: %d, want them only with a wrapped Watcher", n)
			}
			if err := s.Release(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-got:
				if err != nil {
					t.Fatalf("the waiter after the release: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the waiter was not told its turn within 5s")
			}
		})
	}
}

// clientWatchers counts the goroutines running clientv3's Watcher streams.
func clientWatchers() int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "etcd/client/v3.(*watchGRPCStream)") {
			n++
		}
	}
	return n
}

// TestWatchResumesAfterAReset: a Backend's watch stream whose connection
// breaks is opened again from the revision after the last event it read,
// as clientv3's Watcher does, so that what happened while it was down is
// reported, and the watch goes on: here a release (a lock key deleted)
// while the client could not reach the server.
func TestWatchResumesAfterAReset(t *testing.T) {
	c := etcdtest.Start(t, 1)
	prefix := uniquePrefix("resume")
	var cnt etcdtest.Counter
	cli := etcdtest.NewClient(t, clientv3.Config{Endpoints: c.Endpoints(), DialOptions: cnt.DialOptions()})
	admin := etcdtest.NewClient(t, clientv3.Config{Endpoints: c.DirectEndpoints()})
	b, err := etcdlock.NewBackend(cli, etcdlock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx, cancel := context.WithCancel(testenv.Context(t, 30*time.Second))
	defer cancel()
	if _, err := admin.Put(ctx, prefix+"k", "{}"); err != nil {
		t.Fatal(err)
	}
	ready, freed, ended := make(chan struct{}, 1), make(chan string, 4), make(chan error, 1)
	go func() {
		ended <- b.Watch(ctx, func() { ready <- struct{}{} }, func(key string) { freed <- key })
	}()
	select {
	case <-ready:
	case err := <-ended:
		t.Fatalf("Watch = %v before it was up", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the watch not up within 10s")
	}
	c.CutClients(0)
	if _, err := admin.Delete(ctx, prefix+"k"); err != nil {
		t.Fatal(err)
	}
	c.MendClients(0)
	select {
	case key := <-freed:
		if key != "k" {
			t.Fatalf("freed %q, want k", key)
		}
	case err := <-ended:
		t.Fatalf("Watch = %v after a reset, want it to go on", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the deletion made while the connection was down was not reported within 10s")
	}
	if n := cnt.Watches.Load(); n != 2 {
		t.Errorf("%d watches created, want the first and the one that resumed it", n)
	}
	select {
	case <-ready:
		t.Error("ready told again: the watch was started over, not resumed")
	default:
	}
}
