package pg_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
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

// Rule: several Backends (processes) racing for the permits of one key
// never have more than the limit held at once, every grant has its own
// token, and the permits all get used (no claim is refused while a permit
// is free: at most limit holders, and the sum of holds adds up).
func TestSemaphoreNeverMoreThanN(t *testing.T) {
	admin := newPool(t, nil)
	table := newTable(t, admin)
	const limit, workers, rounds = 4, 12, 15
	clients := make([]*core.Client, 3)
	for i := range clients {
		clients[i] = newClient(t, newBackend(t, table))
	}
	var (
		held, peak atomic.Int64
		mu         sync.Mutex
		tokens     = map[uint64]bool{}
		wg         sync.WaitGroup
	)
	ctx := ctxT(t)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := clients[w%len(clients)]
			for range rounds {
				s, err := l.Acquire(ctx, "k", core.Limit(limit), core.TTL(10*time.Second), core.Backoff(time.Millisecond, 20*time.Millisecond))
				if err != nil {
					t.Error(err)
					return
				}
				n := held.Add(1)
				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				if n > limit {
					t.Errorf("%d holders of a semaphore of %d", n, limit)
				}
				mu.Lock()
				if tokens[s.Token()] {
					t.Errorf("token %d granted twice", s.Token())
				}
				tokens[s.Token()] = true
				mu.Unlock()
				time.Sleep(time.Millisecond) // hold it a little: the work
				held.Add(-1)
				if err := s.Release(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(tokens) != workers*rounds {
		t.Errorf("%d distinct tokens, want %d", len(tokens), workers*rounds)
	}
	if p := peak.Load(); p < 2 {
		t.Logf("peak holders %d: the permits were never shared", p)
	}
	var n int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{table + "_permits"}.Sanitize()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d permit rows left after every release", n)
	}
	// The header stays, ended, with the key's last token.
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{table}.Sanitize()+` WHERE expire_at > now()`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d live lock table rows left after every release", n)
	}
}

// Rule: concurrent TryAcquires of a free semaphore from several Backends
// are all granted when there are enough permits: the header lock makes the
// count exact, with no busy answer while a permit is free.
func TestSemaphoreTryAllGranted(t *testing.T) {
	admin := newPool(t, nil)
	table := newTable(t, admin)
	const limit = 6
	backends := []*pg.Backend{newBackend(t, table), newBackend(t, table), newBackend(t, table)}
	ctx := ctxT(t)
	for round := range 5 {
		key := fmt.Sprintf("k%d", round)
		var wg sync.WaitGroup
		errs := make(chan error, limit+2)
		for i := range limit + 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := backends[i%len(backends)].TryAcquire(ctx, permitReq(key, limit, time.Minute))
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		granted, busy := 0, 0
		for err := range errs {
			switch {
			case err == nil:
				granted++
			case errors.Is(err, core.ErrNotAcquired):
				busy++
			default:
				t.Fatal(err)
			}
		}
		if granted != limit || busy != 2 {
			t.Errorf("round %d: %d granted, %d busy; want %d and 2", round, granted, busy, limit)
		}
	}
}

// Rule: fencing tokens strictly increase per key across permits and across
// mutex use of the same key.
func TestSemaphoreTokensIncrease(t *testing.T) {
	admin := newPool(t, nil)
	table := newTable(t, admin)
	b := newBackend(t, table)
	ctx := ctxT(t)
	var last uint64
	check := func(what string, l core.Lease) {
		t.Helper()
		if l.Token <= last {
			t.Fatalf("%s: token %d after %d", what, l.Token, last)
		}
		last = l.Token
	}
	for range 3 {
		var reqs []core.AcquireRequest
		for range 3 {
			req := permitReq("k", 3, time.Minute)
			l, err := b.TryAcquire(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			check("permit", l)
			reqs = append(reqs, req)
		}
		// One freed permit, taken again, keeps counting up.
		if err := b.Release(ctx, relReq(reqs[1])); err != nil {
			t.Fatal(err)
		}
		req := permitReq("k", 3, time.Minute)
		l, err := b.TryAcquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		check("permit again", l)
		reqs[1] = req
		for _, r := range reqs {
			if err := b.Release(ctx, relReq(r)); err != nil {
				t.Fatal(err)
			}
		}
		m := core.AcquireRequest{Key: "k", Owner: "m", OwnerToken: testenv.Name("m"), TTL: time.Minute}
		l, err = b.TryAcquire(ctx, m)
		if err != nil {
			t.Fatalf("mutex after the last permit's release: %v", err)
		}
		check("mutex", l)
		if err := b.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: m.OwnerToken}); err != nil {
			t.Fatal(err)
		}
	}
	// A semaphore taking over an expired mutex row counts up from its
	// token.
	m := core.AcquireRequest{Key: "e", Owner: "m", OwnerToken: testenv.Name("m"), TTL: 50 * time.Millisecond}
	l, err := b.TryAcquire(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	last = l.Token
	if _, err := admin.Exec(ctx, `UPDATE `+pgx.Identifier{table}.Sanitize()+` SET expire_at = now() - interval '1 second', token = token + 1000000000 WHERE key = 'e'`); err != nil {
		t.Fatal(err)
	}
	last += 1000000000
	l, err = b.TryAcquire(ctx, permitReq("e", 2, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	check("permit after an expired mutex", l)
}

// Rule: Holders lists every permit oldest first with its limit, List has
// one Info per permit (and the mutexes), Inspect gives the oldest permit,
// and ForceRelease frees every permit: their holders learn of it at their
// next renewal and the key is free.
func TestPermitAdmin(t *testing.T) {
	admin := newPool(t, nil)
	table := newTable(t, admin)
	l := newClient(t, newBackend(t, table))
	ctx := ctxT(t)
	var held []core.Session
	for i := range 3 {
		s, err := l.TryAcquire(ctx, "sem", core.Limit(4), core.WithOwner(fmt.Sprintf("w%d", i)), core.TTL(1500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, s)
	}
	m, err := l.TryAcquire(ctx, "mutex", core.WithOwner("m"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Release(ctx)

	holders, err := l.Holders(ctx, "sem")
	if err != nil {
		t.Fatal(err)
	}
	if len(holders) != 3 {
		t.Fatalf("holders: %+v", holders)
	}
	for i, h := range holders {
		if h.Owner != fmt.Sprintf("w%d", i) || h.Token != held[i].Token() || h.Limit != 4 || h.Key != "sem" || h.Remaining <= 0 || h.AcquiredAt.IsZero() {
			t.Errorf("holder %d: %+v", i, h)
		}
	}
	mh, err := l.Holders(ctx, "mutex")
	if err != nil || len(mh) != 1 || mh[0].Owner != "m" || mh[0].Limit != 0 {
		t.Errorf("holders of a mutex: %+v, %v", mh, err)
	}
	if free, err := l.Holders(ctx, "free"); err != nil || len(free) != 0 {
		t.Errorf("holders of a free key: %+v, %v", free, err)
	}
	info, ok, err := l.Inspect(ctx, "sem")
	if err != nil || !ok || info.Owner != "w0" || info.Limit != 4 {
		t.Errorf("Inspect: %+v, %v, %v; want the oldest permit", info, ok, err)
	}
	list, err := l.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, i := range list {
		got = append(got, i.Key+"/"+i.Owner)
	}
	if want := "mutex/m sem/w0 sem/w1 sem/w2"; strings.Join(got, " ") != want {
		t.Errorf("List = %v, want %s", got, want)
	}

	released, err := l.ForceRelease(ctx, "sem")
	if err != nil || !released {
		t.Fatalf("ForceRelease = %v, %v", released, err)
	}
	for _, s := range held {
		select {
		case <-s.Done():
			if !errors.Is(s.Err(), core.ErrLeaseLost) {
				t.Errorf("after ForceRelease: %v", s.Err())
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a permit's holder did not learn of the ForceRelease")
		}
	}
	if _, ok, err := l.Inspect(ctx, "sem"); ok || err != nil {
		t.Errorf("Inspect after ForceRelease: %v, %v", ok, err)
	}
	if released, err := l.ForceRelease(ctx, "sem"); err != nil || released {
		t.Errorf("ForceRelease of a free key = %v, %v", released, err)
	}
	s, err := l.TryAcquire(ctx, "sem")
	if err != nil {
		t.Fatalf("mutex after ForceRelease: %v", err)
	}
	_ = s.Release(ctx)
	if released, err := l.ForceRelease(ctx, "mutex"); err != nil || !released {
		t.Errorf("ForceRelease of a mutex = %v, %v", released, err)
	}
}

// Rule: without the permits table (a lock table made by an earlier
// version), mutexes work, and a permit claim fails with an error naming the
// table and the fix; once the table is made, claims work.
func TestPermitsTableMissing(t *testing.T) {
	admin := newPool(t, nil)
	table := testenv.Name("dislock_test_nopermits_")
	dropAtCleanup(t, admin, pgx.Identifier{table})
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
	s, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
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
	admin := newPool(t, nil)
	table := newTable(t, admin)
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
	if err := admin.QueryRow(ctx, `SELECT expire_at - now() FROM `+pgx.Identifier{table}.Sanitize()+` WHERE key = 's'`).Scan(&left); err != nil || left < 90*time.Second {
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
	admin := newPool(t, nil)
	table := newTable(t, admin, pg.WithAsyncCommit())
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
// commit, prepared statements or none.
func TestPermitExecModes(t *testing.T) {
	admin := newPool(t, nil)
	table := newTable(t, admin)
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
			b := newBackendPool(t, table, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode.mode }, mode.opts...)
			l := newClient(t, b)
			ctx := ctxT(t)
			key := "k-" + mode.name
			var held []core.Session
			for range 2 {
				for range 2 { // twice each: cached statements are used again
					s, err := l.TryAcquire(ctx, key, core.Limit(3), core.TTL(time.Minute))
					if err != nil {
						t.Fatal(err)
					}
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
		})
	}
}

// Rule: semaphores work on the legacy table too, without fencing tokens
// (0), next to the older tool's rows: a mutex claim of a semaphore's key is
// a limit mismatch, and the last release frees the key.
func TestPermitLegacy(t *testing.T) {
	admin := newPool(t, nil)
	table := newTable(t, admin, pg.WithLegacyTable())
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
	admin := newPool(t, nil)
	table := newTable(t, admin)
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
			SELECT xmin, xmax, 'h' AS x FROM `+pgx.Identifier{table}.Sanitize()+` WHERE key = 'hot'
			UNION ALL SELECT xmin, xmax, holder FROM `+pgx.Identifier{table + "_permits"}.Sanitize()+` WHERE key = 'hot') r`).Scan(&s); err != nil {
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
// key's header row) is aborted by the server within the claim bound, and
// takes no permit.
func TestPermitClaimBounded(t *testing.T) {
	admin := newPool(t, nil)
	table := newTable(t, admin)
	ctx := ctxT(t)
	b := newBackend(t, table, pg.WithClaimTimeout(400*time.Millisecond))
	first := permitReq("k", 3, time.Minute)
	if _, err := b.TryAcquire(ctx, first); err != nil {
		t.Fatal(err)
	}
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM `+pgx.Identifier{table}.Sanitize()+` WHERE key = 'k' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = b.TryAcquire(ctx, permitReq("k", 3, time.Minute))
	took := time.Since(start)
	if err == nil || errors.Is(err, core.ErrNotAcquired) || !strings.Contains(err.Error(), "57014") {
		t.Fatalf("held-up claim: %v, want the server's statement timeout", err)
	}
	if took > b.ClaimBound() {
		t.Errorf("the claim ended after %v, past ClaimBound %v", took, b.ClaimBound())
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	hs, err := b.Holders(ctx, "k")
	if err != nil || len(hs) != 1 || hs[0].Owner != first.Owner {
		t.Fatalf("holders after the aborted claim: %+v, %v", hs, err)
	}
}

// Rule: a role without the privileges semaphores need on the permits table
// keeps its mutexes, and a permit claim names the missing privilege and the
// GRANT; once granted, claims work without a restart.
func TestPermitsRolePrivileges(t *testing.T) {
	needDirect(t, "it connects as a role of its own")
	admin := newPool(t, nil)
	table := newTable(t, admin)
	ident := pgx.Identifier{table}.Sanitize()
	permits := pgx.Identifier{table + "_permits"}.Sanitize()
	ctx := ctxT(t)
	role := testenv.Name("dislock_role_")
	if _, err := admin.Exec(ctx, `CREATE ROLE `+role+` LOGIN`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), `DROP OWNED BY `+role)
		_, _ = admin.Exec(context.Background(), `DROP ROLE `+role)
	})
	if _, err := admin.Exec(ctx, `GRANT SELECT, INSERT, UPDATE, DELETE ON `+ident+` TO `+role+`; GRANT SELECT, INSERT ON `+permits+` TO `+role); err != nil {
		t.Fatal(err)
	}
	pool := newPool(t, func(c *pgxpool.Config) { c.ConnConfig.User = role })
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
	table := testenv.Name("dislock_test_identity_")
	dropAtCleanup(t, admin, pgx.Identifier{table})
	ctx := ctxT(t)
	if _, err := admin.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (key text PRIMARY KEY, owner text NOT NULL, holder text NOT NULL,
	token bigint GENERATED BY DEFAULT AS IDENTITY, acquired_at timestamptz NOT NULL, expire_at timestamptz NOT NULL)`, pgx.Identifier{table}.Sanitize())); err != nil {
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
