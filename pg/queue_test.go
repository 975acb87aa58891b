package pg_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/pg"
	"github.com/jackc/pgx/v5/pgxpool"
)

// watchTurns subscribes b's WatchTurns until the test ends and returns the
// channel of the turns it delivers, once the subscription is in place.
func watchTurns(t *testing.T, b *pg.Backend) <-chan testenv.Turn {
	turns, _ := testenv.WatchTurns(t, b)
	return turns
}

// nextTurn returns the next turn for one of keys (others are skipped), or
// fails after 10s.
func nextTurn(t *testing.T, ch <-chan testenv.Turn, key string) testenv.Turn {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case tr := <-ch:
			if tr.Key == key {
				return tr
			}
		case <-deadline:
			t.Fatalf("no turn for %q within 10s", key)
		}
	}
}

// noTurn fails when a turn for key arrives: it releases sentinel (which has
// a queued waiter) and expects that turn first, so no sleep decides.
func noTurn(t *testing.T, b *pg.Backend, ch <-chan testenv.Turn, key string) {
	t.Helper()
	ctx := ctxT(t)
	sentinel := key + "-sentinel"
	tryAs(t, b, sentinel, "sentinel-holder", "", 0)
	if _, err := b.TryAcquire(ctx, acq(sentinel, "sentinel-waiter-holder", "sentinel-waiter", time.Minute)); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("sentinel waiter: %v", err)
	}
	if err := b.Release(ctx, core.ReleaseRequest{Key: sentinel, OwnerToken: "sentinel-holder"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(10 * time.Second)
	for {
		select {
		case tr := <-ch:
			switch tr.Key {
			case key:
				t.Fatalf("turn %+v notified, want none", tr)
			case sentinel:
				return
			}
		case <-deadline:
			t.Fatal("the sentinel's turn never arrived")
		}
	}
}

func acq(key, token, waiter string, waiterTTL time.Duration) core.AcquireRequest {
	return core.AcquireRequest{Key: key, Owner: "o-" + token, OwnerToken: token, TTL: time.Minute, Waiter: waiter, WaiterTTL: waiterTTL}
}

// tryAs makes one attempt and checks its outcome: want "" for a grant,
// "busy" for busy with a holder, "turn" for busy without one (free, but
// another waiter's turn).
func tryAs(t *testing.T, b *pg.Backend, key, token, waiter string, waiterTTL time.Duration, want ...string) {
	t.Helper()
	w := ""
	if len(want) > 0 {
		w = want[0]
	}
	if waiter != "" && waiterTTL == 0 {
		waiterTTL = time.Minute
	}
	_, err := b.TryAcquire(ctxT(t), acq(key, token, waiter, waiterTTL))
	var na *core.NotAcquiredError
	got := ""
	switch {
	case err == nil:
	case errors.As(err, &na) && na.Holder != nil:
		got = "busy"
	case errors.As(err, &na):
		got = "turn"
	default:
		t.Fatalf("TryAcquire(%s as %s/%s): %v", key, token, waiter, err)
	}
	if got != w {
		t.Fatalf("TryAcquire(%s as %s/%s) = %q (%v), want %q", key, token, waiter, got, err, w)
	}
}

func release(t *testing.T, b *pg.Backend, key, token string) {
	t.Helper()
	if err := b.Release(ctxT(t), core.ReleaseRequest{Key: key, OwnerToken: token}); err != nil {
		t.Fatal(err)
	}
}

// queueOf returns the waiter ids of key's waiters column, in order.
func queueOf(t *testing.T, admin *pgxpool.Pool, table, key string) []string {
	t.Helper()
	var ids []string
	err := admin.QueryRow(ctxT(t), `SELECT coalesce(array_agg(e->>'w' ORDER BY i), '{}')
FROM `+quoted(table)+`, jsonb_array_elements(waiters) WITH ORDINALITY AS x(e, i) WHERE key = $1`, key).Scan(&ids)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// rowVersion is the row's xmin: it changes with every write of the row.
func rowVersion(t *testing.T, admin *pgxpool.Pool, table, key string) string {
	t.Helper()
	var v string
	if err := admin.QueryRow(ctxT(t), `SELECT xmin::text FROM `+quoted(table)+` WHERE key = $1`, key).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// Rule: the waiters column keeps the line in order: a refresh keeps a
// waiter's place, a grant or a Leave takes it out, a dead waiter's retry
// goes to the tail, a release drops a queue of dead waiters only, and a key
// whose last waiter was served or left is an ended row (it keeps the key's
// token).
func TestQueueRowLayout(t *testing.T) {
	admin, table := adminAndTable(t)
	b := newBackend(t, table)
	ctx := ctxT(t)
	wantQueue := func(key, want string) {
		t.Helper()
		if q := queueOf(t, admin, table, key); strings.Join(q, ",") != want {
			t.Fatalf("queue of %q %v, want [%s]", key, q, want)
		}
	}
	leave := func(key, waiter string) {
		t.Helper()
		if err := b.Leave(ctx, key, waiter); err != nil {
			t.Fatal(err)
		}
	}
	// Places that expire, on two keys: one sleep for both.
	tryAs(t, b, "expired", "h", "", 0)
	tryAs(t, b, "expired", "t1", "dead", 200*time.Millisecond, "busy")
	tryAs(t, b, "expired", "t2", "live", time.Minute, "busy")
	tryAs(t, b, "expired-only", "h", "", 0)
	tryAs(t, b, "expired-only", "t1", "w", 200*time.Millisecond, "busy")

	k := "line"
	tryAs(t, b, k, "h", "", 0)
	tryAs(t, b, k, "t1", "w1", 0, "busy")
	tryAs(t, b, k, "t2", "w2", 0, "busy")
	tryAs(t, b, k, "t3", "w3", 0, "busy")
	tryAs(t, b, k, "t1b", "w1", 0, "busy") // keeps its place
	tryAs(t, b, k, "t4", "w4", 0, "busy")
	wantQueue(k, "w1,w2,w3,w4")
	leave(k, "w2") // from the middle
	wantQueue(k, "w1,w3,w4")
	release(t, b, k, "h")
	tryAs(t, b, k, "t1", "w1", 0)
	wantQueue(k, "w3,w4")
	release(t, b, k, "t1")
	tryAs(t, b, k, "t3", "w3", 0)
	release(t, b, k, "t3")
	leave(k, "w4") // the last waiter leaves the free key
	expectEnded(t, admin, table, k)
	tryAs(t, b, k, "t5", "w5", 0)
	release(t, b, k, "t5")
	expectEnded(t, admin, table, k)

	time.Sleep(300 * time.Millisecond) // the places of 200ms expire on the server
	release(t, b, "expired", "h")
	tryAs(t, b, "expired", "t1", "dead", time.Minute, "turn")
	wantQueue("expired", "live,dead")
	release(t, b, "expired-only", "h") // drops the dead queue with the row
	tryAs(t, b, "expired-only", "x", "", 0)
	wantQueue("expired-only", "")
}

// Rule: busy tries write nothing: a waiterless one never, a queued
// waiter's only when its place needs refreshing (less than half its TTL
// left).
func TestQueueQuietPaths(t *testing.T) {
	admin, table := adminAndTable(t)
	b := newBackend(t, table)
	k := "quiet"
	tryAs(t, b, k, "h", "", 0)
	v := rowVersion(t, admin, table, k)
	tryAs(t, b, k, "x", "", 0, "busy")
	if rowVersion(t, admin, table, k) != v {
		t.Fatal("a waiterless busy try wrote the row")
	}
	release(t, b, k, "h")

	tryAs(t, b, k, "h", "", 0)
	tryAs(t, b, k, "t1", "w1", time.Minute, "busy")
	v = rowVersion(t, admin, table, k)
	tryAs(t, b, k, "t1", "w1", time.Minute, "busy")
	if rowVersion(t, admin, table, k) != v {
		t.Fatal("a queued waiter's busy try with a fresh place wrote the row")
	}
	tryAs(t, b, k, "t1", "w1", 10*time.Minute, "busy") // less than half of 10m left: refresh
	if rowVersion(t, admin, table, k) == v {
		t.Fatal("a place with less than half its TTL left was not refreshed")
	}
	// The holder's own repeat of its claim is a success and queues nothing.
	tryAs(t, b, k, "h", "w-h", time.Minute)
	if q := queueOf(t, admin, table, k); strings.Join(q, ",") != "w1" {
		t.Fatalf("queue %v, want w1", q)
	}
}

// Rule: WithoutNotify keeps the order of the line but sends nothing.
func TestQueueWithoutNotify(t *testing.T) {
	table := freshTable(t)
	b := newBackend(t, table)
	turns := watchTurns(t, b)
	quiet := newBackend(t, table, pg.WithoutNotify(), pg.WithoutListen())
	k2 := "quiet-release"
	tryAs(t, quiet, k2, "h", "", 0)
	tryAs(t, quiet, k2, "t1", "w1", 0, "busy")
	tryAs(t, quiet, k2, "t2", "w2", 0, "busy")
	release(t, quiet, k2, "h")
	noTurn(t, b, turns, k2)
	tryAs(t, quiet, k2, "t2", "w2", 0, "turn")
	tryAs(t, quiet, k2, "t1", "w1", 0)
}

// Rule: a table of an earlier version (no waiters column) is refused with
// an error naming the statement that adds it; Migrate adds it.
func TestQueueColumnMissing(t *testing.T) {
	admin, table := adminAndTable(t)
	ident := quoted(table)
	ctx := ctxT(t)
	if _, err := admin.Exec(ctx, `ALTER TABLE `+ident+` DROP COLUMN waiters`); err != nil {
		t.Fatal(err)
	}
	_, err := pg.NewBackend(ctx, admin, pg.WithTable(table))
	if !errors.Is(err, pg.ErrSchema) || !strings.Contains(err.Error(), "ALTER TABLE "+ident+" ADD COLUMN IF NOT EXISTS waiters jsonb") {
		t.Fatalf("NewBackend on a table without waiters: %v", err)
	}
	b, err := pg.NewBackend(ctx, admin, pg.WithTable(table), pg.WithAutoMigrate())
	if err != nil {
		t.Fatalf("WithAutoMigrate did not add the column: %v", err)
	}
	_ = b.Close()
	sql, err := pg.SchemaSQL(table, false, false)
	if err != nil || !strings.Contains(sql, "waiters     jsonb") {
		t.Fatalf("SchemaSQL = %q, %v", sql, err)
	}
}

// Rule: the legacy table has no queue: a waiter is granted a free key at
// once, Leave does nothing, and every release notifies with the bare key.
func TestQueueLegacyTable(t *testing.T) {
	table := freshTable(t, pg.WithLegacyTable())
	b := newBackend(t, table, pg.WithLegacyTable())
	turns := watchTurns(t, b)
	k := "legacy"
	tryAs(t, b, k, "h", "", 0)
	tryAs(t, b, k, "t1", "w1", 0, "busy")
	release(t, b, k, "h")
	if tr := nextTurn(t, turns, k); tr.Waiter != "" {
		t.Fatalf("turn %+v, want no waiter", tr)
	}
	tryAs(t, b, k, "x", "", 0) // no queue to respect
	if err := b.Leave(ctxT(t), k, "w1"); err != nil {
		t.Fatal(err)
	}
	release(t, b, k, "x")
	if tr := nextTurn(t, turns, k); tr.Waiter != "" {
		t.Fatalf("turn %+v, want no waiter", tr)
	}
}

// Rule: keys of any content survive the trip through a turn's payload.
func TestQueueTurnPayload(t *testing.T) {
	table := freshTable(t)
	b := newBackend(t, table)
	turns := watchTurns(t, b)
	for i, k := range []string{"3:abc", "k:with:colons", "ключ", strings.Repeat("x", core.MaxKeyLen)} {
		w := fmt.Sprintf("waiter-%d", i)
		tryAs(t, b, k, "h", "", 0)
		tryAs(t, b, k, "t", w, 0, "busy")
		release(t, b, k, "h")
		if tr := nextTurn(t, turns, k); tr.Waiter != w {
			t.Fatalf("turn %+v, want waiter %s", tr, w)
		}
	}
}

// Rule: the queue's statements work without prepared statements
// (QueryExecModeExec, as behind PgBouncer), notifications included.
func TestQueueExecMode(t *testing.T) {
	table := freshTable(t)
	b := newBackendPool(t, table, execMode)
	turns := watchTurns(t, newBackend(t, table))
	ctx := ctxT(t)
	k := "exec"
	tryAs(t, b, k, "h", "", 0)
	tryAs(t, b, k, "t1", "w1", 0, "busy")
	tryAs(t, b, k, "t2", "w2", 0, "busy")
	tryAs(t, b, k, "t3", "w3", 0, "busy")
	release(t, b, k, "h")
	if tr := nextTurn(t, turns, k); tr.Waiter != "w1" {
		t.Fatalf("turn %+v, want w1", tr)
	}
	tryAs(t, b, k, "t2", "w2", 0, "turn")
	if err := b.Leave(ctx, k, "w1"); err != nil {
		t.Fatal(err)
	}
	if tr := nextTurn(t, turns, k); tr.Waiter != "w2" {
		t.Fatalf("turn after Leave %+v, want w2", tr)
	}
	tryAs(t, b, k, "t2", "w2", 0)
	if ok, err := b.ForceRelease(ctx, k); err != nil || !ok {
		t.Fatalf("ForceRelease = %v, %v", ok, err)
	}
	if tr := nextTurn(t, turns, k); tr.Waiter != "w3" {
		t.Fatalf("turn after ForceRelease %+v, want w3", tr)
	}
	tryAs(t, b, k, "t3", "w3", 0)
	release(t, b, k, "t3")
	noTurn(t, b, turns, k)
}

// Rule: a token column GENERATED ALWAYS AS IDENTITY, which the claim's
// upsert cannot set, is refused with the statement that switches it to
// clock tokens.
func TestSchemaTokenAlwaysIdentity(t *testing.T) {
	admin := newPool(t, nil)
	table := scratchTable(t, admin, "dislock_test_always_")
	ident := quoted(table)
	ctx := ctxT(t)
	if _, err := admin.Exec(ctx, `CREATE TABLE `+ident+` (key text PRIMARY KEY, owner text NOT NULL, holder text NOT NULL,
	token bigint GENERATED ALWAYS AS IDENTITY, acquired_at timestamptz NOT NULL, expire_at timestamptz NOT NULL, waiters jsonb)`); err != nil {
		t.Fatal(err)
	}
	_, err := pg.NewBackend(ctx, admin, pg.WithTable(table))
	if !errors.Is(err, pg.ErrSchema) || !strings.Contains(err.Error(), "DROP IDENTITY") {
		t.Fatalf("NewBackend on an ALWAYS identity token: %v", err)
	}
	if _, err := admin.Exec(ctx, `ALTER TABLE `+ident+` ALTER COLUMN token DROP IDENTITY IF EXISTS,
	ALTER COLUMN token SET DEFAULT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint`); err != nil {
		t.Fatal(err)
	}
	b, err := pg.NewBackend(ctx, admin, pg.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	tryAs(t, b, "k", "h", "", 0)
}

// expectEnded fails unless key's row is ended: free, with no holder and
// nobody queued.
func expectEnded(t *testing.T, admin *pgxpool.Pool, table, key string) {
	t.Helper()
	var n int
	if err := admin.QueryRow(ctxT(t), `SELECT count(*) FROM `+quoted(table)+`
	WHERE key = $1 AND holder = '' AND expire_at = '-infinity' AND waiters IS NULL`, key).Scan(&n); err != nil || n != 1 {
		t.Fatalf("ended rows of the free key %q with nobody queued: %d (%v), want 1", key, n, err)
	}
}

// legacyRecorder is a Backend on the legacy table that records what the
// engine asks of it: the Waiter of every claim, the Leave calls and whether
// it subscribed through WatchTurns.
type legacyRecorder struct {
	*pg.Backend
	mu      sync.Mutex
	waiters []string
	leaves  int
	turns   bool
}

func (r *legacyRecorder) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	r.mu.Lock()
	r.waiters = append(r.waiters, req.Waiter)
	r.mu.Unlock()
	return r.Backend.TryAcquire(ctx, req)
}

func (r *legacyRecorder) Leave(ctx context.Context, key, waiter string) error {
	r.mu.Lock()
	r.leaves++
	r.mu.Unlock()
	return r.Backend.Leave(ctx, key, waiter)
}

func (r *legacyRecorder) WatchTurns(ctx context.Context, ready func(), fn func(key, waiter string)) error {
	r.mu.Lock()
	r.turns = true
	r.mu.Unlock()
	return r.Backend.WatchTurns(ctx, ready, fn)
}

// TestLegacyTableRunsWithoutQueue: the legacy table keeps no waiter queue,
// so the engine runs its Backend as a core.Watcher, not a core.Queuer: a
// wait sends no Waiter, one that gives up sends no Leave (a wake-up it did
// not use passes to the next waiter of its process instead), and the
// subscription is Watch's. A wait still gets the key once it is released.
func TestLegacyTableRunsWithoutQueue(t *testing.T) {
	_, table := adminAndTable(t, pg.WithLegacyTable())
	holder := newClient(t, newBackend(t, table, pg.WithLegacyTable()))
	rec := &legacyRecorder{Backend: newBackend(t, table, pg.WithLegacyTable())}
	waiter := newClient(t, rec)
	key := testenv.Name("legacy-noqueue-")
	s, err := holder.TryAcquire(ctxT(t), key)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := waiter.Acquire(ctx, key); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("Acquire of a held key = %v, want ErrNotAcquired", err)
	}
	got := testenv.AcquireAsync(ctxT(t), waiter, key)
	if err := s.Release(ctxT(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if r := <-got; r.Err != nil {
		t.Fatalf("wait after the release: %v", r.Err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for i, w := range rec.waiters {
		if w != "" {
			t.Errorf("claim %d of %d carried Waiter %q: the engine ran the queue protocol on a table without a queue", i+1, len(rec.waiters), w)
		}
	}
	if rec.leaves != 0 {
		t.Errorf("%d Leave calls, want none", rec.leaves)
	}
	if rec.turns {
		t.Error("the engine subscribed through WatchTurns, want Watch")
	}
}

// TestLegacyTableLockerKeepsNoQueue: the Locker that New returns runs the
// queue protocol on the full table only; on the legacy table its Backend is
// run as a core.Watcher.
func TestLegacyTableLockerKeepsNoQueue(t *testing.T) {
	for _, c := range []struct {
		name  string
		opts  []pg.Option
		queue bool
	}{
		{"full", nil, true},
		{"legacy", []pg.Option{pg.WithLegacyTable()}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			table := freshTable(t, c.opts...)
			l, err := pg.New(ctxT(t), newPool(t, nil), append([]pg.Option{pg.WithTable(table)}, c.opts...)...)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			t.Cleanup(func() { _ = l.Close() })
			if _, q := core.QueuerOf(l.Backend()); q != c.queue {
				t.Errorf("the engine runs the Backend as a core.Queuer: %v, want %v", q, c.queue)
			}
			if _, w := l.Backend().(core.Watcher); !w {
				t.Error("the Backend is not a core.Watcher")
			}
		})
	}
}
