package mysqllock_test

import (
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/mysqllock"
)

// Rule: a turn wakes at once (KILL QUERY of its lock wait, not at the end of
// the wait) the watcher that serves the waiter, and no other: with waits of
// a minute, the turn of a waiter queued by a process with a watcher reaches
// that process at once and not another; the turn of a waiter whose place
// names no watcher (its process had none running when it queued) wakes
// every watcher of the table. A watcher that stopped leaves no
// registration behind.
func TestTurnWakesTheWaitersWatcher(t *testing.T) {
	admin, table := adminAndTable(t)
	ctx := ctxT(t)
	holder := newBackend(t, table, mysqllock.WithWatchPoll(time.Minute))
	waiter := newBackend(t, table, mysqllock.WithWatchPoll(time.Minute))
	stray := newBackend(t, table, mysqllock.WithWatchPoll(time.Minute)) // no watcher
	mine, stop1 := testenv.WatchTurns(t, waiter)
	other, stop2 := testenv.WatchTurns(t, holder)
	// Both watchers in their minute-long lock wait: their waiting
	// connections, named by the watchers table, run GET_LOCK.
	for deadline := time.Now().Add(20 * time.Second); ; {
		var n int
		if err := admin.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST AS p JOIN `"+table+
			"_watchers` AS w ON p.ID = SUBSTRING_INDEX(SUBSTRING_INDEX(w.name, ':', 2), ':', -1) WHERE p.INFO LIKE '%GET_LOCK(%'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 2 watchers in their wait after 20s", n)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition
	}
	h := core.AcquireRequest{Key: "k", Owner: "h", OwnerToken: "h", TTL: time.Minute}
	if _, err := holder.TryAcquire(ctx, h); err != nil {
		t.Fatal(err)
	}
	w1 := core.AcquireRequest{Key: "k", Owner: "w", OwnerToken: "w", TTL: time.Minute, Waiter: "w1", WaiterTTL: time.Minute}
	if _, err := waiter.TryAcquire(ctx, w1); err == nil {
		t.Fatal("the waiter was granted a held key")
	}
	w2 := core.AcquireRequest{Key: "k", Owner: "s", OwnerToken: "s", TTL: time.Minute, Waiter: "w2", WaiterTTL: time.Minute}
	if _, err := stray.TryAcquire(ctx, w2); err == nil {
		t.Fatal("the second waiter was granted a held key")
	}
	if err := holder.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: "h"}); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-mine:
		if got != (testenv.Turn{Key: "k", Waiter: "w1"}) {
			t.Errorf("the waiter's process: turn %+v, want k/w1", got)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter's process: no turn within 20s (the wait lasts a minute): the release did not wake its watcher")
	}
	select {
	case got := <-other:
		t.Errorf("another process got turn %+v at once: the release woke a watcher that does not serve the waiter", got)
	case <-time.After(2 * time.Second):
	}
	if _, err := waiter.TryAcquire(ctx, w1); err != nil {
		t.Fatalf("the waiter told its turn: %v", err)
	}
	if err := waiter.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: "w"}); err != nil {
		t.Fatal(err)
	}
	// w2's place names no watcher: every watcher is woken, and reads the
	// turns it has not read (other: w1's too).
	for name, ch := range map[string]<-chan testenv.Turn{"the waiter's process": mine, "another process": other} {
		for got := (testenv.Turn{}); got != (testenv.Turn{Key: "k", Waiter: "w2"}); {
			select {
			case got = <-ch:
			case <-time.After(20 * time.Second):
				t.Fatalf("%s: no turn of w2 within 20s (the wait lasts a minute): the release did not wake it", name)
			}
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
