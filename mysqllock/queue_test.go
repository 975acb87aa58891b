package mysqllock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/mysqllock"
)

// Rule: a release wakes the watchers of the table at once (KILL QUERY of
// their lock wait), not at the end of their wait: with waits of a minute,
// the turn still arrives, in this process and in another, and a watcher
// that stopped leaves no registration behind.
func TestReleaseWakesWatchers(t *testing.T) {
	admin, table := adminAndTable(t)
	ctx := ctxT(t)
	holder := newBackend(t, table, mysqllock.WithWatchPoll(time.Minute))
	waiter := newBackend(t, table, mysqllock.WithWatchPoll(time.Minute))
	type turn struct{ key, waiter string }
	watch := func(b *mysqllock.Backend) (<-chan turn, func()) {
		ch := make(chan turn, 8)
		wctx, cancel := context.WithCancel(context.Background())
		ready, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			b.WatchTurns(wctx, func() { close(ready) }, func(k, w string) { ch <- turn{k, w} })
		}()
		select {
		case <-ready:
		case <-done:
			t.Fatal("WatchTurns ended before it was ready")
		}
		return ch, func() { cancel(); <-done }
	}
	mine, stop1 := watch(waiter)
	other, stop2 := watch(holder)
	h := core.AcquireRequest{Key: "k", Owner: "h", OwnerToken: "h", TTL: time.Minute}
	if _, err := holder.TryAcquire(ctx, h); err != nil {
		t.Fatal(err)
	}
	w := core.AcquireRequest{Key: "k", Owner: "w", OwnerToken: "w", TTL: time.Minute, Waiter: "w1", WaiterTTL: time.Minute}
	if _, err := waiter.TryAcquire(ctx, w); err == nil {
		t.Fatal("the waiter was granted a held key")
	}
	// Both watchers are in their minute-long wait by now, or about to
	// enter it (then they see the turn before they wait).
	if err := holder.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: "h"}); err != nil {
		t.Fatal(err)
	}
	for name, ch := range map[string]<-chan turn{"the waiter's process": mine, "another process": other} {
		select {
		case got := <-ch:
			if got != (turn{"k", "w1"}) {
				t.Errorf("%s: turn %+v, want k/w1", name, got)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("%s: no turn within 20s (the wait lasts a minute): the release did not wake it", name)
		}
	}
	stop1()
	stop2()
	var n int
	if err := admin.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+table+"_watchers`").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d watchers still registered after both stopped", n)
	}
}
