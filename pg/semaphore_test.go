package pg_test

import (
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

// permitReq is a claim of one of limit permits of key, made straight on a
// Backend.
func permitReq(key string, limit int, ttl time.Duration) core.AcquireRequest {
	tok := testenv.Name("tok")
	return core.AcquireRequest{Key: key, Owner: "owner-" + tok, OwnerToken: tok, TTL: ttl, Limit: limit}
}

// refusedTTL is the TTL of claims a test expects to be refused: the engine
// undoes a refused claim (any answer but busy) by owner token, and a claim
// that would outlive the claim bound is undone again once it has passed,
// which makes Close wait for it.
var refusedTTL = core.TTL(500 * time.Millisecond)

func relReq(req core.AcquireRequest) core.ReleaseRequest {
	return core.ReleaseRequest{Key: req.Key, OwnerToken: req.OwnerToken, Limit: req.Limit}
}

// Rule: without the permits table (a lock table made by an earlier
// version), mutexes work, and a permit claim fails with an error naming the
// table and the fix; once the table is made, claims work.
func TestPermitsTableMissing(t *testing.T) {
	admin := newPool(t, nil)
	table := scratchTable(t, admin, "dislock_test_nopermits_")
	ctx := ctxT(t)
	sql, err := pg.SchemaSQL(table, false, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, sql); err != nil {
		t.Fatal(err)
	}
	// A short claim timeout: the engine undoes the refused claims, and
	// Close waits for the claim bound.
	l := newClient(t, newBackend(t, table, pg.WithClaimTimeout(100*time.Millisecond)))
	s := testenv.Hold(t, ctx, l, "k")
	_ = s.Release(ctx)
	_, err = l.TryAcquire(ctx, "k", core.Limit(2), refusedTTL)
	if !errors.Is(err, pg.ErrSchema) || !strings.Contains(err.Error(), table+"_permits") || !strings.Contains(err.Error(), "PermitsSchemaSQL") {
		t.Fatalf("permit claim without the permits table: %v", err)
	}
	// A waiting Acquire ends at once too.
	if _, err := l.Acquire(ctx, "k", core.Limit(2), refusedTTL); !errors.Is(err, pg.ErrSchema) {
		t.Fatalf("waiting permit claim without the permits table: %v", err)
	}
	var n int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname = $1`, table+"_permits").Scan(&n); err != nil || n != 0 {
		t.Fatalf("the permits table was created: %d, %v", n, err)
	}
	if list, err := l.List(ctx, ""); err != nil || len(list) != 0 {
		t.Errorf("List: %v, %v", list, err)
	}
	psql, err := pg.PermitsSchemaSQL(table, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, psql); err != nil {
		t.Fatal(err)
	}
	s, err = l.TryAcquire(ctx, "k", core.Limit(2))
	if err != nil {
		t.Fatalf("permit claim once the table exists: %v", err)
	}
	_ = s.Release(ctx)
	if _, err := pg.PermitsSchemaSQL(strings.Repeat("x", 60), false); !errors.Is(err, core.ErrInvalidOption) {
		t.Errorf("PermitsSchemaSQL of a long name: %v", err)
	}
}

// Rule: a renewal of mutexes and permits together is one call (one
// round trip); each item is renewed, or lost when its lease is gone.
func TestPermitRenewMixed(t *testing.T) {
	admin, table := adminAndTable(t)
	b := newBackend(t, table)
	ctx := ctxT(t)
	m := core.AcquireRequest{Key: "m", Owner: "m", OwnerToken: testenv.Name("m"), TTL: time.Minute}
	if _, err := b.TryAcquire(ctx, m); err != nil {
		t.Fatal(err)
	}
	p1, p2 := permitReq("s", 2, time.Minute), permitReq("s", 2, time.Minute)
	for _, r := range []core.AcquireRequest{p1, p2} {
		if _, err := b.TryAcquire(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Release(ctx, relReq(p2)); err != nil {
		t.Fatal(err)
	}
	res, err := b.Renew(ctx, []core.RenewRequest{
		{Key: "m", OwnerToken: m.OwnerToken, TTL: time.Minute},
		{Key: "s", OwnerToken: p1.OwnerToken, TTL: 2 * time.Minute, Limit: 2},
		{Key: "s", OwnerToken: p2.OwnerToken, TTL: time.Minute, Limit: 2},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res[0] != nil || res[1] != nil || !errors.Is(res[2], core.ErrLeaseLost) {
		t.Fatalf("results %v", res)
	}
	// A renewal naming another limit than the key's is refused.
	res, err = b.Renew(ctx, []core.RenewRequest{{Key: "s", OwnerToken: p1.OwnerToken, TTL: 2 * time.Minute, Limit: 3}})
	if err != nil || !errors.Is(res[0], core.ErrLeaseLost) {
		t.Fatalf("renewal with another limit: %v, %v", res, err)
	}
	hs, err := b.Holders(ctx, "s")
	if err != nil || len(hs) != 1 || hs[0].Remaining < 90*time.Second {
		t.Fatalf("holders after renewal: %+v, %v", hs, err)
	}
	// The header lives as long as the permit.
	var left time.Duration
	if err := admin.QueryRow(ctx, `SELECT expire_at - now() FROM `+quoted(table)+` WHERE key = 's'`).Scan(&left); err != nil || left < 90*time.Second {
		t.Fatalf("header expiry %v, %v", left, err)
	}
	// A mutex release or renewal never touches the header, whatever
	// owner token it names: nothing of that owner's was held.
	for _, tok := range []string{"dislock:semaphore:2", "dislock:semaphore:2:"} {
		if err := b.Release(ctx, core.ReleaseRequest{Key: "s", OwnerToken: tok}); !errors.Is(err, core.ErrLeaseGone) {
			t.Fatalf("mutex release of the header = %v, want ErrLeaseGone", err)
		}
		if res, err := b.Renew(ctx, []core.RenewRequest{{Key: "s", OwnerToken: tok, TTL: time.Hour}}); err != nil || !errors.Is(res[0], core.ErrLeaseLost) {
			t.Fatalf("mutex renewal of the header: %v, %v", res, err)
		}
	}
	if hs, _ := b.Holders(ctx, "s"); len(hs) != 1 {
		t.Fatalf("a mutex release by the header's holder freed the semaphore: %+v", hs)
	}
}

// Rule: a Locker holding 1,000 permits renews them all in one statement
// batch (one round trip) per interval, and none is lost.
func TestPermitRenew1000(t *testing.T) {
	table := freshTable(t, pg.WithAsyncCommit())
	be := newBackendPool(t, table, func(c *pgxpool.Config) { c.MaxConns = 8 }, pg.WithAsyncCommit())
	cb := &countingBackend{Backend: be}
	l := newClient(t, cb)
	const keys, limit, ttl = 250, 4, 3 * time.Second
	ctx := ctxT(t)
	var wg sync.WaitGroup
	sessions := make(chan core.Session, keys*limit)
	// Fewer claimers than pool connections: renewals get a connection
	// while the claims go on.
	const claimers = 4
	for w := range claimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < keys*limit; i += claimers {
				s, err := l.TryAcquire(ctx, fmt.Sprintf("k%d", i%keys), core.Limit(limit), core.TTL(ttl))
				if err != nil {
					t.Error(err)
					return
				}
				sessions <- s
			}
		}()
	}
	wg.Wait()
	close(sessions)
	if t.Failed() {
		return
	}
	calls0, items0 := cb.calls.Load(), cb.items.Load()
	const rounds = 2
	time.Sleep(rounds*ttl/3 + ttl/6) // a measuring window, not synchronisation
	calls, items := cb.calls.Load()-calls0, cb.items.Load()-items0
	t.Logf("%d renew calls, %d permits renewed in %d intervals", calls, items, rounds)
	if calls > rounds+1 || items < rounds*keys*limit {
		t.Errorf("%d renew calls for %d items in %d intervals; want about one call of %d per interval", calls, items, rounds, keys*limit)
	}
	n := 0
	for s := range sessions {
		if s.Err() != nil {
			t.Errorf("permit lost: %v", s.Err())
		}
		n++
	}
	if n != keys*limit {
		t.Errorf("%d sessions", n)
	}
}

// Rule: permits work in every query exec mode, and with asynchronous
// commit, prepared statements or none; the last release leaves no permit
// row and an ended header.
func TestPermitExecModes(t *testing.T) {
	admin, table := adminAndTable(t)
	for _, mode := range []struct {
		name string
		mode pgx.QueryExecMode
		opts []pg.Option
	}{
		{"cache", pgx.QueryExecModeCacheStatement, nil},
		{"describe", pgx.QueryExecModeCacheDescribe, nil},
		{"describe-exec", pgx.QueryExecModeDescribeExec, nil},
		{"exec", pgx.QueryExecModeExec, []pg.Option{pg.WithoutNotify(), pg.WithoutListen()}},
		{"simple-async", pgx.QueryExecModeSimpleProtocol, []pg.Option{pg.WithAsyncCommit()}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			if throughPooler(t) && mode.mode != pgx.QueryExecModeExec && mode.mode != pgx.QueryExecModeSimpleProtocol {
				t.Skip("prepared statements through a transaction pooler")
			}
			b := newBackendPool(t, table, queryMode(mode.mode), mode.opts...)
			l := newClient(t, b)
			ctx := ctxT(t)
			key := "k-" + mode.name
			var held []core.Session
			for range 2 {
				for range 2 { // twice each: cached statements are used again
					s := testenv.Hold(t, ctx, l, key, core.Limit(3), core.TTL(time.Minute))
					held = append(held, s)
					if len(held) == 3 {
						if _, err := l.TryAcquire(ctx, key, core.Limit(3)); !errors.Is(err, core.ErrNotAcquired) {
							t.Fatalf("fourth permit: %v", err)
						}
						if _, err := b.TryAcquire(ctx, permitReq(key, 2, time.Minute)); !errors.Is(err, core.ErrLimitMismatch) {
							t.Fatalf("mismatch: %v", err)
						}
						if err := held[0].Check(ctx); err != nil {
							t.Fatalf("Check: %v", err)
						}
						if err := held[0].Release(ctx); err != nil {
							t.Fatal(err)
						}
						held = held[1:]
					}
				}
			}
			for _, s := range held {
				if err := s.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if hs, err := l.Holders(ctx, key); err != nil || len(hs) != 0 {
				t.Fatalf("holders after release: %+v, %v", hs, err)
			}
			// No permit row is left, and the header is ended (it keeps
			// the key's last token).
			var permits, live int
			if err := admin.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+quoted(table+"_permits")+` WHERE key = $1),
				(SELECT count(*) FROM `+quoted(table)+` WHERE key = $1 AND expire_at > now())`, key).Scan(&permits, &live); err != nil {
				t.Fatal(err)
			}
			if permits != 0 || live != 0 {
				t.Errorf("after every release: %d permit rows, %d live header rows, want none", permits, live)
			}
		})
	}
}

// Rule: semaphores work on the legacy table too, without fencing tokens
// (0), next to the older tool's rows: a mutex claim of a semaphore's key is
// a limit mismatch, and the last release frees the key.
func TestPermitLegacy(t *testing.T) {
	table := freshTable(t, pg.WithLegacyTable())
	b := newBackend(t, table, pg.WithLegacyTable())
	ctx := ctxT(t)
	p1, p2 := permitReq("k", 2, time.Minute), permitReq("k", 2, time.Minute)
	for _, r := range []core.AcquireRequest{p1, p2} {
		l, err := b.TryAcquire(ctx, r)
		if err != nil || l.Token != 0 {
			t.Fatalf("permit on the legacy table: %+v, %v", l, err)
		}
	}
	var na *core.NotAcquiredError
	if _, err := b.TryAcquire(ctx, permitReq("k", 2, time.Minute)); !errors.As(err, &na) || na.Holder == nil || na.Holder.Limit != 2 {
		t.Fatalf("third permit: %v", err)
	}
	if _, err := b.TryAcquire(ctx, core.AcquireRequest{Key: "k", Owner: "m", OwnerToken: "m", TTL: time.Minute}); !errors.Is(err, core.ErrLimitMismatch) {
		t.Fatalf("mutex on a semaphore's key: %v", err)
	}
	if hs, err := b.Holders(ctx, "k"); err != nil || len(hs) != 2 || hs[0].Owner != p1.Owner {
		t.Fatalf("holders: %+v, %v", hs, err)
	}
	res, err := b.Renew(ctx, []core.RenewRequest{{Key: "k", OwnerToken: p1.OwnerToken, TTL: time.Minute, Limit: 2}})
	if err != nil || res[0] != nil {
		t.Fatalf("renew: %v, %v", res, err)
	}
	for _, r := range []core.AcquireRequest{p1, p2} {
		if err := b.Release(ctx, relReq(r)); err != nil {
			t.Fatal(err)
		}
	}
	m := core.AcquireRequest{Key: "k", Owner: "m", OwnerToken: "m", TTL: time.Minute}
	if _, err := b.TryAcquire(ctx, m); err != nil {
		t.Fatalf("mutex after the last release: %v", err)
	}
}

// Rule: a full semaphore is answered by a read: a busy try neither writes
// nor locks the header or the permits.
func TestPermitBusyTryWritesNothing(t *testing.T) {
	admin, table := adminAndTable(t)
	b := newBackend(t, table)
	ctx := ctxT(t)
	for range 2 {
		if _, err := b.TryAcquire(ctx, permitReq("hot", 2, time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	read := func() string {
		var s string
		if err := admin.QueryRow(ctx, `SELECT string_agg(xmin::text || '/' || xmax::text, ',' ORDER BY x) FROM (
			SELECT xmin, xmax, 'h' AS x FROM `+quoted(table)+` WHERE key = 'hot'
			UNION ALL SELECT xmin, xmax, holder FROM `+quoted(table+"_permits")+` WHERE key = 'hot') r`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := read()
	other := newBackend(t, table)
	for range 20 {
		_, err := other.TryAcquire(ctx, permitReq("hot", 2, time.Second))
		var na *core.NotAcquiredError
		if !errors.As(err, &na) || na.Holder == nil || na.Holder.Limit != 2 {
			t.Fatalf("busy answer = %v", err)
		}
	}
	if after := read(); after != before {
		t.Fatalf("busy tries touched the rows: %s → %s", before, after)
	}
}

// Rule: a permit claim held up on the server (another transaction holds the
// key's header row) past the claim timeout is refused by the server when
// the wait ends (pg.ErrClaimTimeout), and takes no permit.
func TestPermitClaimBounded(t *testing.T) {
	const claimTimeout = 400 * time.Millisecond
	admin, table := adminAndTable(t)
	ctx := ctxT(t)
	b := newBackend(t, table, pg.WithClaimTimeout(claimTimeout))
	first := permitReq("k", 3, time.Minute)
	if _, err := b.TryAcquire(ctx, first); err != nil {
		t.Fatal(err)
	}
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM `+quoted(table)+` WHERE key = 'k' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	claimPastBound(t, claimTimeout, func() { _ = tx.Rollback(ctx) }, func() error {
		_, err := b.TryAcquire(ctx, permitReq("k", 3, time.Minute))
		return err
	})
	hs, err := b.Holders(ctx, "k")
	if err != nil || len(hs) != 1 || hs[0].Owner != first.Owner {
		t.Fatalf("holders after the refused claim: %+v, %v", hs, err)
	}
	if _, err := b.TryAcquire(ctx, permitReq("k", 3, time.Minute)); err != nil {
		t.Fatalf("a permit claim once the header is free: %v", err)
	}
}

// Rule: a role without the privileges semaphores need on the permits table
// keeps its mutexes, and a permit claim names the missing privilege and the
// GRANT; once granted, claims work without a restart.
func TestPermitsRolePrivileges(t *testing.T) {
	needDirect(t, "it connects as a role of its own")
	admin, table := adminAndTable(t)
	ident := quoted(table)
	permits := quoted(table + "_permits")
	ctx := ctxT(t)
	role, pool := loginRole(t, admin, `SELECT, INSERT, UPDATE, DELETE ON `+ident, `SELECT, INSERT ON `+permits)
	b, err := pg.NewBackend(ctx, pool, pg.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.TryAcquire(ctx, permitReq("k", 2, time.Minute))
	if !errors.Is(err, pg.ErrSchema) || !strings.Contains(err.Error(), "UPDATE, DELETE") || !strings.Contains(err.Error(), "GRANT") || !strings.Contains(err.Error(), permits) {
		t.Fatalf("permit claim without UPDATE, DELETE on the permits table: %v", err)
	}
	if _, err := admin.Exec(ctx, `GRANT UPDATE, DELETE ON `+permits+` TO `+role); err != nil {
		t.Fatal(err)
	}
	req := permitReq("k", 2, time.Minute)
	if _, err := b.TryAcquire(ctx, req); err != nil {
		t.Fatalf("once granted: %v", err)
	}
	if err := b.Release(ctx, relReq(req)); err != nil {
		t.Fatal(err)
	}
}

// Rule: on a lock table of an earlier version (identity tokens), a permit
// claim fails with the ALTER TABLE that switches it to clock tokens:
// permits could otherwise hand out tokens that a later mutex claim goes
// back from.
func TestPermitsNeedClockTokens(t *testing.T) {
	admin := newPool(t, nil)
	table := scratchTable(t, admin, "dislock_test_identity_")
	ctx := ctxT(t)
	if _, err := admin.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (key text PRIMARY KEY, owner text NOT NULL, holder text NOT NULL,
	token bigint GENERATED BY DEFAULT AS IDENTITY, acquired_at timestamptz NOT NULL, expire_at timestamptz NOT NULL)`, quoted(table))); err != nil {
		t.Fatal(err)
	}
	b, err := pg.NewBackend(ctx, admin, pg.WithTable(table), pg.WithAutoMigrate())
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.TryAcquire(ctx, permitReq("k", 2, time.Minute))
	if !errors.Is(err, pg.ErrSchema) || !strings.Contains(err.Error(), "DROP IDENTITY") {
		t.Fatalf("permit claim on identity tokens: %v", err)
	}
}
