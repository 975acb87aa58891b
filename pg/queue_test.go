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
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// turn is one notification WatchTurns delivered.
type turn struct{ key, waiter string }

// watchTurns subscribes b's WatchTurns until the test ends and returns the
// channel of the turns it delivers, once the subscription is in place.
func watchTurns(t *testing.T, b *pg.Backend) <-chan turn {
	t.Helper()
	ch := make(chan turn, 64)
	ready := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		var once sync.Once
		err := b.WatchTurns(ctx, func() { once.Do(func() { close(ready) }) }, func(key, waiter string) {
			ch <- turn{key, waiter}
		})
		if ctx.Err() == nil {
			t.Errorf("WatchTurns: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	select {
	case <-ready:
	case <-time.After(15 * time.Second):
		t.Fatal("WatchTurns never ready")
	}
	return ch
}

// nextTurn returns the next turn for one of keys (others are skipped), or
// fails after 10s.
func nextTurn(t *testing.T, ch <-chan turn, key string) turn {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case tr := <-ch:
			if tr.key == key {
				return tr
			}
		case <-deadline:
			t.Fatalf("no turn for %q within 10s", key)
		}
	}
}

// noTurn fails when a turn for key arrives: it releases sentinel (which has
// a queued waiter) and expects that turn first, so no sleep decides.
func noTurn(t *testing.T, b *pg.Backend, ch <-chan turn, key string) {
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
			switch tr.key {
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
FROM `+pgx.Identifier{table}.Sanitize()+`, jsonb_array_elements(waiters) WITH ORDINALITY AS x(e, i) WHERE key = $1`, key).Scan(&ids)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// rowVersion is the row's xmin: it changes with every write of the row.
func rowVersion(t *testing.T, admin *pgxpool.Pool, table, key string) string {
	t.Helper()
	var v string
	if err := admin.QueryRow(ctxT(t), `SELECT xmin::text FROM `+pgx.Identifier{table}.Sanitize()+` WHERE key = $1`, key).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// Rule: waiters are served first come, first served across processes; a
// release notifies the first live waiter only, and one that is not first
// is answered busy (without a holder) on a free key.
func TestQueueFIFO(t *testing.T) {
	admin := newPool(t, nil)
	table := newTable(t, admin)
	holder, b1, b2, b3 := newBackend(t, table), newBackend(t, table), newBackend(t, table), newBackend(t, table)
	turns := watchTurns(t, holder)
	k := "fifo"
	tryAs(t, holder, k, "h", "", 0)
	tryAs(t, b1, k, "t1", "w1", 0, "busy")
	tryAs(t, b2, k, "t2", "w2", 0, "busy")
	tryAs(t, b3, k, "t3", "w3", 0, "busy")
	tryAs(t, b1, k, "t1b", "w1", 0, "busy") // keeps its place
	if q := queueOf(t, admin, table, k); strings.Join(q, ",") != "w1,w2,w3" {
		t.Fatalf("queue %v, want w1,w2,w3", q)
	}
	release(t, holder, k, "h")
	if tr := nextTurn(t, turns, k); tr.waiter != "w1" {
		t.Fatalf("turn %+v, want w1", tr)
	}
	if _, ok, _ := holder.Inspect(ctxT(t), k); ok {
		t.Fatal("a free key with waiters shows as held")
	}
	if l, _ := holder.List(ctxT(t), k); len(l) != 0 {
		t.Fatalf("List shows a free key with waiters: %+v", l)
	}
	tryAs(t, b3, k, "t3", "w3", 0, "turn")
	tryAs(t, b2, k, "t2", "w2", 0, "turn")
	tryAs(t, b1, k, "t1", "w1", 0)
	if q := queueOf(t, admin, table, k); strings.Join(q, ",") != "w2,w3" {
		t.Fatalf("queue after w1's grant %v, want w2,w3", q)
	}
	release(t, b1, k, "t1")
	if tr := nextTurn(t, turns, k); tr.waiter != "w2" {
		t.Fatalf("turn %+v, want w2", tr)
	}
	tryAs(t, b2, k, "t2", "w2", 0)
	release(t, b2, k, "t2")
	if tr := nextTurn(t, turns, k); tr.waiter != "w3" {
		t.Fatalf("turn %+v, want w3", tr)
	}
	tryAs(t, b3, k, "t3", "w3", 0)
	release(t, b3, k, "t3")
	// Nobody left in line: the row is ended (it keeps the key's token) and
	// nothing is notified.
	expectEnded(t, admin, table, k)
	noTurn(t, holder, turns, k)
}

// Rule: a waiter whose place expired does not block those behind it: the
// release names the next live one, and a waiterless try still cannot barge
// past a live waiter, only past dead ones.
func TestQueueExpiredWaiterSkipped(t *testing.T) {
	admin := newPool(t, nil)
	table := newTable(t, admin)
	b := newBackend(t, table)
	turns := watchTurns(t, b)
	k := "expired"
	tryAs(t, b, k, "h", "", 0)
	tryAs(t, b, k, "t1", "dead", 200*time.Millisecond, "busy")
	tryAs(t, b, k, "t2", "live", time.Minute, "busy")
	time.Sleep(300 * time.Millisecond) // the dead waiter's place expires on the server
	release(t, b, k, "h")
	if tr := nextTurn(t, turns, k); tr.waiter != "live" {
		t.Fatalf("turn %+v, want live", tr)
	}
	tryAs(t, b, k, "x", "", 0, "turn") // no barging past a live waiter
	tryAs(t, b, k, "t1", "dead", time.Minute, "turn")
	if q := queueOf(t, admin, table, k); strings.Join(q, ",") != "live,dead" {
		t.Fatalf("queue %v, want live,dead (the dead waiter's retry goes to the tail)", q)
	}
	tryAs(t, b, k, "t2", "live", 0)
	release(t, b, k, "t2")
	if tr := nextTurn(t, turns, k); tr.waiter != "dead" {
		t.Fatalf("turn %+v, want dead", tr)
	}

	// Only dead waiters: anyone may claim, and the queue is cleared.
	k2 := "expired-only"
	tryAs(t, b, k2, "h", "", 0)
	tryAs(t, b, k2, "t1", "w", 100*time.Millisecond, "busy")
	time.Sleep(200 * time.Millisecond)
	release(t, b, k2, "h") // drops the dead queue with the row
	tryAs(t, b, k2, "x", "", 0)
	if q := queueOf(t, admin, table, k2); len(q) != 0 {
		t.Fatalf("queue %v after a claim past dead waiters", q)
	}
}

// Rule: Leave takes a waiter out of line; when it was first on a free key,
// the next live waiter is notified; leaving a queue one is not in is no
// error; the last waiter leaving a free key leaves an ended row (the key's
// token stays).
func TestQueueLeave(t *testing.T) {
	admin := newPool(t, nil)
	table := newTable(t, admin)
	b := newBackend(t, table)
	turns := watchTurns(t, b)
	ctx := ctxT(t)
	k := "leave"
	tryAs(t, b, k, "h", "", 0)
	tryAs(t, b, k, "t1", "w1", 0, "busy")
	tryAs(t, b, k, "t2", "w2", 0, "busy")
	tryAs(t, b, k, "t3", "w3", 0, "busy")
	if err := b.Leave(ctx, k, "w2"); err != nil { // not first: nobody told
		t.Fatal(err)
	}
	if q := queueOf(t, admin, table, k); strings.Join(q, ",") != "w1,w3" {
		t.Fatalf("queue %v, want w1,w3", q)
	}
	if err := b.Leave(ctx, k, "nobody"); err != nil {
		t.Fatal(err)
	}
	if err := b.Leave(ctx, "no-such-key", "w1"); err != nil {
		t.Fatal(err)
	}
	release(t, b, k, "h")
	if tr := nextTurn(t, turns, k); tr.waiter != "w1" {
		t.Fatalf("turn %+v, want w1", tr)
	}
	if err := b.Leave(ctx, k, "w1"); err != nil { // first in line on a free key
		t.Fatal(err)
	}
	if tr := nextTurn(t, turns, k); tr.waiter != "w3" {
		t.Fatalf("turn after Leave %+v, want w3", tr)
	}
	if err := b.Leave(ctx, k, "w3"); err != nil {
		t.Fatal(err)
	}
	expectEnded(t, admin, table, k)
	tryAs(t, b, k, "x", "", 0)
}

// Rule: a release with nobody queued notifies nobody, and busy tries write
// nothing: a waiterless one never, a queued waiter's only when its place
// needs refreshing (less than half its TTL left).
func TestQueueQuietPaths(t *testing.T) {
	admin := newPool(t, nil)
	table := newTable(t, admin)
	b := newBackend(t, table)
	turns := watchTurns(t, b)
	k := "quiet"
	tryAs(t, b, k, "h", "", 0)
	v := rowVersion(t, admin, table, k)
	tryAs(t, b, k, "x", "", 0, "busy")
	if rowVersion(t, admin, table, k) != v {
		t.Fatal("a waiterless busy try wrote the row")
	}
	release(t, b, k, "h")
	noTurn(t, b, turns, k)

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

// Rule: ForceRelease keeps the queue and tells its first live waiter;
// WithoutNotify keeps the order but sends nothing.
func TestQueueForceReleaseAndWithoutNotify(t *testing.T) {
	admin := newPool(t, nil)
	table := newTable(t, admin)
	b := newBackend(t, table)
	turns := watchTurns(t, b)
	ctx := ctxT(t)
	k := "force"
	tryAs(t, b, k, "h", "", 0)
	tryAs(t, b, k, "t1", "w1", 0, "busy")
	if ok, err := b.ForceRelease(ctx, k); err != nil || !ok {
		t.Fatalf("ForceRelease = %v, %v", ok, err)
	}
	if tr := nextTurn(t, turns, k); tr.waiter != "w1" {
		t.Fatalf("turn %+v, want w1", tr)
	}
	tryAs(t, b, k, "x", "", 0, "turn")
	tryAs(t, b, k, "t1", "w1", 0)

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

// Rule: 16 Lockers (16 processes) waiting on one key take it in turns, each
// woken by its own turn: every acquisition costs a few statements, not one
// per waiting process.
func TestQueueHandoffRequests(t *testing.T) {
	admin := newPool(t, nil)
	table := newTable(t, admin)
	const lockers, rounds = 8, 3
	var counts []*attemptCounter
	var ls []*core.Client
	for range lockers {
		c := &attemptCounter{Backend: newBackend(t, table)}
		counts = append(counts, c)
		ls = append(ls, newClient(t, c))
	}
	ctx := ctxT(t)
	var wg sync.WaitGroup
	errs := make(chan error, lockers)
	for _, l := range ls {
		wg.Go(func() {
			for range rounds {
				s, err := l.Acquire(ctx, "handoff", core.TTL(10*time.Second), core.Backoff(3*time.Second, 3*time.Second))
				if err != nil {
					errs <- err
					return
				}
				time.Sleep(2 * time.Millisecond)
				if err := s.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	total := 0
	for _, c := range counts {
		c.mu.Lock()
		total += c.n
		c.mu.Unlock()
	}
	// Each acquisition: the attempt that queues and the one its turn wakes,
	// plus refreshes (every 666ms while waiting) and races with the
	// others' arrival.
	per := float64(total) / (lockers * rounds)
	t.Logf("%.2f attempts per acquisition", per)
	if per > 4 {
		t.Errorf("%.1f attempts per acquisition, want at most 4", per)
	}
}

// attemptCounter counts a Backend's TryAcquire calls.
type attemptCounter struct {
	*pg.Backend
	mu sync.Mutex
	n  int
}

func (c *attemptCounter) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	return c.Backend.TryAcquire(ctx, req)
}

// Rule: a table of an earlier version (no waiters column) is refused with
// an error naming the statement that adds it; Migrate adds it.
func TestQueueColumnMissing(t *testing.T) {
	admin := newPool(t, nil)
	table := newTable(t, admin)
	ident := pgx.Identifier{table}.Sanitize()
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
	admin := newPool(t, nil)
	table := newTable(t, admin, pg.WithLegacyTable())
	b := newBackend(t, table, pg.WithLegacyTable())
	turns := watchTurns(t, b)
	k := "legacy"
	tryAs(t, b, k, "h", "", 0)
	tryAs(t, b, k, "t1", "w1", 0, "busy")
	release(t, b, k, "h")
	if tr := nextTurn(t, turns, k); tr.waiter != "" {
		t.Fatalf("turn %+v, want no waiter", tr)
	}
	tryAs(t, b, k, "x", "", 0) // no queue to respect
	if err := b.Leave(ctxT(t), k, "w1"); err != nil {
		t.Fatal(err)
	}
	release(t, b, k, "x")
	if tr := nextTurn(t, turns, k); tr.waiter != "" {
		t.Fatalf("turn %+v, want no waiter", tr)
	}
}

// Rule: keys of any content survive the trip through a turn's payload.
func TestQueueTurnPayload(t *testing.T) {
	admin := newPool(t, nil)
	table := newTable(t, admin)
	b := newBackend(t, table)
	turns := watchTurns(t, b)
	for i, k := range []string{"3:abc", "k:with:colons", "ключ", strings.Repeat("x", core.MaxKeyLen)} {
		w := fmt.Sprintf("waiter-%d", i)
		tryAs(t, b, k, "h", "", 0)
		tryAs(t, b, k, "t", w, 0, "busy")
		release(t, b, k, "h")
		if tr := nextTurn(t, turns, k); tr.waiter != w {
			t.Fatalf("turn %+v, want waiter %s", tr, w)
		}
	}
}

// Rule: the queue's statements work without prepared statements
// (QueryExecModeExec, as behind PgBouncer), notifications included.
func TestQueueExecMode(t *testing.T) {
	admin := newPool(t, nil)
	table := newTable(t, admin)
	exec := func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec }
	b := newBackendPool(t, table, exec)
	turns := watchTurns(t, newBackend(t, table))
	ctx := ctxT(t)
	k := "exec"
	tryAs(t, b, k, "h", "", 0)
	tryAs(t, b, k, "t1", "w1", 0, "busy")
	tryAs(t, b, k, "t2", "w2", 0, "busy")
	tryAs(t, b, k, "t3", "w3", 0, "busy")
	release(t, b, k, "h")
	if tr := nextTurn(t, turns, k); tr.waiter != "w1" {
		t.Fatalf("turn %+v, want w1", tr)
	}
	tryAs(t, b, k, "t2", "w2", 0, "turn")
	if err := b.Leave(ctx, k, "w1"); err != nil {
		t.Fatal(err)
	}
	if tr := nextTurn(t, turns, k); tr.waiter != "w2" {
		t.Fatalf("turn after Leave %+v, want w2", tr)
	}
	tryAs(t, b, k, "t2", "w2", 0)
	if ok, err := b.ForceRelease(ctx, k); err != nil || !ok {
		t.Fatalf("ForceRelease = %v, %v", ok, err)
	}
	if tr := nextTurn(t, turns, k); tr.waiter != "w3" {
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
	table := testenv.Name("dislock_test_always_")
	ident := pgx.Identifier{table}.Sanitize()
	ctx := ctxT(t)
	dropAtCleanup(t, admin, pgx.Identifier{table})
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
	if err := admin.QueryRow(ctxT(t), `SELECT count(*) FROM `+pgx.Identifier{table}.Sanitize()+`
	WHERE key = $1 AND holder = '' AND expire_at = '-infinity' AND waiters IS NULL`, key).Scan(&n); err != nil || n != 1 {
		t.Fatalf("ended rows of the free key %q with nobody queued: %d (%v), want 1", key, n, err)
	}
}
