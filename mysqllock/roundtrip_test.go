package mysqllock_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/mysqllock"
	"github.com/go-sql-driver/mysql"
)

// countingDB is a pool whose connections count the packets they write.
func countingDB(t *testing.T, writes *atomic.Int64) *sql.DB {
	t.Helper()
	cfg, err := mysqllock.ParseDSN(testDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	name := "dislock-counting-" + t.Name()
	addr := cfg.Addr
	mysql.RegisterDialContext(name, func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: c, writes: writes}, nil
	})
	cfg.Net = name
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return db
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// countingBackend returns a Backend on a fresh table (also returned), on
// a pool of one connection that counts in writes the packets it writes.
func countingBackend(t *testing.T) (*mysqllock.Backend, *atomic.Int64, string) {
	t.Helper()
	table := freshTable(t)
	writes := new(atomic.Int64)
	b, err := mysqllock.NewBackend(ctxT(t), countingDB(t, writes), mysqllock.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b, writes, table
}

// Rule: an acquire and a release are one request each (one packet written:
// COM_STMT_EXECUTE of a CALL prepared on the connection), once the
// connection has prepared them; a renewal of several leases is one too.
func TestOneRequestPerOperation(t *testing.T) {
	b, writes, _ := countingBackend(t)
	ctx := ctxT(t)
	req := core.AcquireRequest{Key: "k", Owner: "o", OwnerToken: "t1", TTL: time.Minute}
	// Warm the connection: its statements are prepared at first use.
	if _, err := b.TryAcquire(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: "t1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Renew(ctx, []core.RenewRequest{{Key: "k", OwnerToken: "t1", TTL: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	count := func(what string, f func() error) {
		t.Helper()
		before := writes.Load()
		start := time.Now()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if n := writes.Load() - before; n != 1 {
			t.Errorf("%s: %d requests, want 1", what, n)
		}
		t.Logf("%s: 1 request, %v", what, time.Since(start))
	}
	count("acquire", func() error { _, err := b.TryAcquire(ctx, req); return err })
	req2 := core.AcquireRequest{Key: "k2", Owner: "o", OwnerToken: "t2", TTL: time.Minute}
	count("acquire", func() error { _, err := b.TryAcquire(ctx, req2); return err })
	count("renew of 2", func() error {
		res, err := b.Renew(ctx, []core.RenewRequest{{Key: "k", OwnerToken: "t1", TTL: time.Minute}, {Key: "k2", OwnerToken: "t2", TTL: time.Minute}})
		for _, e := range res {
			if e != nil {
				return e
			}
		}
		return err
	})
	count("release", func() error { return b.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: "t1"}) })
	count("release", func() error { return b.Release(ctx, core.ReleaseRequest{Key: "k2", OwnerToken: "t2"}) })
}

// Rule: on a free key that nobody waits on, a claim by a caller that does
// not wait and its release are one UPDATE each, without a CALL or a
// SELECT, and each claim's token is strictly above the last; a try of a
// key held by another is one plain SELECT (no CALL) once the Backend has
// found it held.
func TestFreeKeyPairStatements(t *testing.T) {
	table := freshTable(t)
	db := newDB(t)
	db.SetMaxOpenConns(1) // the session's counters are those of the calls
	ctx := ctxT(t)
	b, err := mysqllock.NewBackend(ctx, db, mysqllock.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var last uint64
	pair := func(i int) {
		t.Helper()
		tok := fmt.Sprint("t", i)
		l, err := b.TryAcquire(ctx, core.AcquireRequest{Key: "k", Owner: "o", OwnerToken: tok, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if l.Token <= last || !l.ExpiresAt.Equal(l.AcquiredAt.Add(time.Minute)) {
			t.Fatalf("lease %+v after token %d", l, last)
		}
		last = l.Token
		if err := b.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: tok}); err != nil {
			t.Fatal(err)
		}
	}
	// The first claim inserts the row; the first release prunes.
	pair(0)
	pair(1)
	counters := func() [3]int64 {
		return [3]int64{sessionStatus(t, db, "Com_call_procedure"), sessionStatus(t, db, "Com_select"),
			sessionStatus(t, db, "Com_stmt_execute")}
	}
	const pairs = 20
	before := counters()
	for i := range pairs {
		pair(2 + i)
	}
	after := counters()
	if calls, selects, execs := after[0]-before[0], after[1]-before[1], after[2]-before[2]; calls != 0 || selects != 0 || execs != 2*pairs {
		t.Errorf("%d claims and releases of a free key: %d CALLs, %d SELECTs, %d statements; want 0, 0, %d", pairs, calls, selects, execs, 2*pairs)
	}
	// A release of a lease no longer held still answers so; also of the
	// last one, whose release left its owner token in the row (it set the
	// expiry alone), and so does its renewal.
	for _, tok := range []string{"t1", fmt.Sprint("t", 1+pairs)} {
		if err := b.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: tok}); !errors.Is(err, core.ErrLeaseGone) {
			t.Fatalf("release of the ended lease %s: %v, want ErrLeaseGone", tok, err)
		}
		errs, err := b.Renew(ctx, []core.RenewRequest{{Key: "k", OwnerToken: tok, TTL: time.Minute}})
		if err != nil || !errors.Is(errs[0], core.ErrLeaseGone) {
			t.Fatalf("renewal of the ended lease %s: %v %v, want ErrLeaseGone", tok, err, errs)
		}
	}
	// Held by another: the first try finds it so, the next ones read it.
	held, err := b.TryAcquire(ctx, core.AcquireRequest{Key: "k", Owner: "o", OwnerToken: "holder", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	try := func() {
		t.Helper()
		_, err := b.TryAcquire(ctx, core.AcquireRequest{Key: "k", Owner: "o", OwnerToken: "other", TTL: time.Minute})
		var busy *core.NotAcquiredError
		if !errors.As(err, &busy) || busy.Holder == nil || busy.Holder.Token != held.Token {
			t.Fatalf("try of a held key: %v, want busy naming its holder", err)
		}
	}
	try()
	before = counters()
	try()
	try()
	after = counters()
	if calls, selects, execs := after[0]-before[0], after[1]-before[1], after[2]-before[2]; calls != 0 || selects != 2 || execs != 2 {
		t.Errorf("2 tries of a held key: %d CALLs, %d SELECTs, %d statements; want 0, 2, 2", calls, selects, execs)
	}
}

// Rule: the release of a lease that a waiter queued behind is one request
// (the release procedure's CALL, which tells the waiter), as in a hand-off.
func TestReleaseWithWaiterOneRequest(t *testing.T) {
	b, writes, table := countingBackend(t)
	ctx := ctxT(t)
	other := newBackend(t, table)
	for i := range 3 {
		tok := fmt.Sprint("t", i)
		if _, err := b.TryAcquire(ctx, core.AcquireRequest{Key: "k", Owner: "o", OwnerToken: tok, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		_, err := other.TryAcquire(ctx, core.AcquireRequest{Key: "k", Owner: "w", OwnerToken: "w" + tok, TTL: time.Minute,
			Waiter: "waiter" + tok, WaiterTTL: time.Minute})
		if !errors.Is(err, core.ErrNotAcquired) {
			t.Fatalf("queued try: %v, want busy", err)
		}
		before := writes.Load()
		if err := b.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: tok}); err != nil {
			t.Fatal(err)
		}
		if n := writes.Load() - before; i > 0 && n != 1 {
			t.Errorf("release %d with a waiter queued: %d requests, want 1", i, n)
		}
		if err := other.Leave(ctx, "k", "waiter"+tok); err != nil {
			t.Fatal(err)
		}
	}
}

// Rule: while a plain try's claim of a key is on its way, a later plain try
// of that key in the same Backend sends nothing: it waits for that claim
// and answers busy with the winner's lease when it won.
func TestPlainTriesShareTheClaimOnItsWay(t *testing.T) {
	admin, table := adminAndTable(t)
	b := newBackend(t, table)
	ctx := ctxT(t)
	req := func(owner string) core.AcquireRequest {
		return core.AcquireRequest{Key: "k", Owner: owner, OwnerToken: rand.Text(), TTL: time.Minute}
	}
	// A key released here, so that the first try claims it with one
	// UPDATE, which the row's lock holds up on the server.
	r := req("setup")
	if _, err := b.TryAcquire(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: r.OwnerToken}); err != nil {
		t.Fatal(err)
	}
	tx := lockRow(t, admin, table, "k")
	defer tx.Rollback()
	try := func(r core.AcquireRequest) <-chan testenv.Result[core.Lease] {
		return testenv.Async(func() (core.Lease, error) { return b.TryAcquire(ctx, r) })
	}
	first := try(req("first"))
	if !testenv.WaitFor(10*time.Second, func() bool { return mysqllock.ClaimOnItsWay(b, "k") }) {
		t.Fatal("the first try's claim is not on its way")
	}
	second := try(req("second"))
	if !testenv.WaitFor(10*time.Second, func() bool { return mysqllock.ClaimWaiters(b, "k") == 1 }) {
		t.Fatal("the second try does not wait for the first one's claim")
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	a1 := testenv.Receive(t, first, 10*time.Second, "the first try did not return")
	a2 := testenv.Receive(t, second, 10*time.Second, "the second try did not return")
	if a1.Err != nil {
		t.Fatalf("the first try: %v", a1.Err)
	}
	var busy *core.NotAcquiredError
	if !errors.As(a2.Err, &busy) || busy.Holder == nil || busy.Holder.Owner != "first" || busy.Holder.Token != a1.V.Token {
		t.Fatalf("the second try = %v, want busy, held by first with token %d", a2.Err, a1.V.Token)
	}
}
