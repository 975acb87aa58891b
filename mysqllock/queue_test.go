package mysqllock_test

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/mysqllock"
)

// waitWatchersInWait waits, 20s at most, until n watchers of table are in
// their lock wait: their waiting connections, named by the watchers table,
// run GET_LOCK.
func waitWatchersInWait(t *testing.T, admin *sql.DB, table string, n int) {
	t.Helper()
	ctx := ctxT(t)
	for deadline := time.Now().Add(20 * time.Second); ; {
		var got int
		if err := admin.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST AS p JOIN `"+table+
			"_watchers` AS w ON p.ID = SUBSTRING_INDEX(SUBSTRING_INDEX(w.name, ':', 2), ':', -1) WHERE p.INFO LIKE '%GET_LOCK(%'").Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d watchers in their wait after 20s", got, n)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition
	}
}

// holdAndQueue has holder take the key "k" for a minute (owner token "h")
// and waiter queue for it as waiter name (owner token "w"), its claim
// answered busy. It returns the waiter's request.
func holdAndQueue(t *testing.T, ctx context.Context, holder, waiter *mysqllock.Backend, name string) core.AcquireRequest {
	t.Helper()
	h := core.AcquireRequest{Key: "k", Owner: "h", OwnerToken: "h", TTL: time.Minute}
	if _, err := holder.TryAcquire(ctx, h); err != nil {
		t.Fatal(err)
	}
	w := core.AcquireRequest{Key: "k", Owner: "w", OwnerToken: "w", TTL: time.Minute, Waiter: name, WaiterTTL: time.Minute}
	if _, err := waiter.TryAcquire(ctx, w); err == nil {
		t.Fatal("the waiter was granted a held key")
	}
	return w
}

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
	// Both watchers in their minute-long lock wait.
	waitWatchersInWait(t, admin, table, 2)
	w1 := holdAndQueue(t, ctx, holder, waiter, "w1")
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

// Rule: a watcher's subscription is one CALL that a wake-up does not end
// (on MariaDB, whose procedures' handlers take the KILL QUERY of the wait):
// turns that wake it again and again, and a backlog of more turns than one
// read of the loop takes, all reach it, each once, without another CALL.
func TestWatchIsOneCallAcrossWakeUps(t *testing.T) {
	admin, table := adminAndTable(t)
	ctx := ctxT(t)
	var version string
	if err := admin.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
		t.Fatal(err)
	}
	holder := newBackend(t, table, mysqllock.WithWatchPoll(time.Minute))
	waiter := newBackend(t, table, mysqllock.WithWatchPoll(time.Minute))
	turns, _ := testenv.WatchTurns(t, waiter)
	next := func(want testenv.Turn, what string) {
		t.Helper()
		got := testenv.Receive(t, turns, 20*time.Second, "%s: no turn within 20s (the wait lasts a minute): the release did not wake the watcher", what)
		if got != want {
			t.Fatalf("%s: turn %+v, want %+v", what, got, want)
		}
	}
	for i := range 5 {
		w := holdAndQueue(t, ctx, holder, waiter, "w")
		if err := holder.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: "h"}); err != nil {
			t.Fatal(err)
		}
		next(testenv.Turn{Key: "k", Waiter: "w"}, "hand-off "+strconv.Itoa(i))
		if _, err := waiter.TryAcquire(ctx, w); err != nil {
			t.Fatalf("the waiter told its turn: %v", err)
		}
		if err := waiter.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: "w"}); err != nil {
			t.Fatal(err)
		}
	}
	// 100 turns at once (more than a read takes), then a wake-up of every
	// watcher of the table.
	if _, err := admin.ExecContext(ctx, "INSERT INTO `"+table+"_turns` (`key`, waiter, at) WITH RECURSIVE s (n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < 100) SELECT 'b', CONCAT('w', n), 0 FROM s"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.ExecContext(ctx, "CALL `"+table+"_wake`(1, '')"); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 100; i++ {
		next(testenv.Turn{Key: "b", Waiter: "w" + strconv.Itoa(i)}, "backlog")
	}
	select {
	case got := <-turns:
		t.Errorf("turn %+v after the backlog: sent twice or never sent", got)
	case <-time.After(500 * time.Millisecond):
	}
	if n := mysqllock.WatchCalls(waiter); n != 1 && strings.Contains(version, "MariaDB") {
		t.Errorf("%d CALLs of watch for 6 wake-ups on %s, want 1", n, version)
	}
}

// Rule: a watcher's CALL of watch ends after its life (at the first read
// past it) and the watcher calls again; replacing the procedure (as Migrate
// does for another version) while a watcher runs neither hangs (MariaDB
// does not hold the procedure for a running CALL; a server that does
// holds it for the CALL's life) nor leaves the waiters unserved.
func TestWatchCallLife(t *testing.T) {
	_, table := adminAndTable(t)
	b := newBackend(t, table, mysqllock.WithWatchPoll(200*time.Millisecond), mysqllock.WithWatchLife(500*time.Millisecond))
	_, stop := testenv.WatchTurns(t, b)
	time.Sleep(2 * time.Second) // the CALLs of 2s of watching
	stop()
	if n := mysqllock.WatchCalls(b); n < 2 || n > 6 {
		t.Errorf("%d CALLs of watch in 2s with a life of 0.5s and a poll of 0.2s, want 2 to 6", n)
	}
}

// TestReplaceWatchWhileWatching: see TestWatchCallLife.
func TestReplaceWatchWhileWatching(t *testing.T) {
	admin, table := adminAndTable(t)
	ctx := ctxT(t)
	opts := []mysqllock.Option{mysqllock.WithTable(table), mysqllock.WithWatchPoll(300 * time.Millisecond),
		mysqllock.WithWatchLife(time.Second)}
	holder, err := mysqllock.New(ctx, newDB(t), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Close() })
	waiter, err := mysqllock.New(ctx, newDB(t), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { waiter.Close() })
	s, err := holder.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	got := testenv.AcquireAsync(ctx, waiter, "k")
	// The waiter's watcher in its wait.
	waitWatchersInWait(t, admin, table, 1)
	start := time.Now()
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if _, err := admin.ExecContext(dctx, "DROP PROCEDURE `"+table+"_watch`"); err != nil {
		t.Fatalf("DROP PROCEDURE of watch while a watcher runs: %v (after %v)", err, time.Since(start))
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("DROP PROCEDURE of watch waited %v for the watcher's CALL, whose life is 1s", took)
	}
	if err := mysqllock.Migrate(ctx, admin, mysqllock.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if r := testenv.Receive(t, got, 15*time.Second, "the waiter did not get the key within 15s of its release"); r.Err != nil {
		t.Fatalf("the waiter: %v", r.Err)
	}
}

// Rule: kills that land anywhere in the watcher's loop (in its reads, in
// the sending of turns, in its account of them) lose no turn and hand none
// over twice: 300 turns written one by one while another connection kills
// the watcher's statements as fast as it can all reach it, once each.
func TestWatchUnderKills(t *testing.T) {
	admin, table := adminAndTable(t)
	ctx := ctxT(t)
	b := newBackend(t, table, mysqllock.WithWatchPoll(time.Minute))
	turns, _ := testenv.WatchTurns(t, b)
	stop := make(chan struct{})
	killed := make(chan int)
	go func() {
		n := 0
		defer func() { killed <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := admin.ExecContext(ctx, "CALL `"+table+"_wake`(1, '')"); err != nil {
				t.Error(err)
				return
			}
			n++
		}
	}()
	const total = 300
	go func() {
		for i := 1; i <= total; i++ {
			if _, err := admin.ExecContext(ctx, "INSERT INTO `"+table+"_turns` (`key`, waiter, at) VALUES ('k', ?, 0)", "w"+strconv.Itoa(i)); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	got := map[string]int{}
	for len(got) < total {
		select {
		case turn := <-turns:
			got[turn.Waiter]++
			if got[turn.Waiter] > 1 {
				t.Fatalf("turn of %s handed over twice", turn.Waiter)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%d of %d turns within 20s of the last", len(got), total)
		}
	}
	close(stop)
	t.Logf("%d wakes of every watcher; %d CALLs of watch", <-killed, mysqllock.WatchCalls(b))
	select {
	case turn := <-turns:
		t.Errorf("turn %+v after all %d", turn, total)
	case <-time.After(300 * time.Millisecond):
	}
}
