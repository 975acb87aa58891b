package mysqllock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/mysqltest"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/mysqllock"
)

// Rule: Open never puts the DSN or its password in an error, whether the
// DSN cannot be parsed or the server cannot be reached.
func TestOpenKeepsSecrets(t *testing.T) {
	const secret = testenv.Secret
	// A port the test saw closed, and a lock table no run creates: the
	// outcome does not depend on what listens on the machine or on what
	// earlier runs left in a database.
	addr := testenv.ClosedAddr(t)
	table := testenv.Name("dislock_nowhere_")
	open := func(ctx context.Context, dsn string, opts ...mysqllock.Option) (*core.Client, error) {
		return mysqllock.Open(ctx, dsn, append(opts, mysqllock.WithTable(table))...)
	}
	testenv.OpenKeepsSecret(t, open,
		"mysql://user:"+secret+"@"+addr+"/db?timeout=1s",
		"mysql://user:"+secret+"@127.0.0.1:bad/db",
		"mysql://user:"+secret+"@"+addr+"/db?nosuchparam=%zz",
		"user:"+secret+"@tcp("+addr+")/db?timeout=1s",
		"user:"+secret+"@tcp("+addr+"/db",
		"user:"+secret+"@tcp("+addr+")/db?parseTime=notabool",
	)
}

// Rule: Open returns a Locker that owns its pool (goleak in TestMain
// catches one left open) and takes a mysql:// URL or a go-sql-driver DSN; a
// missing schema is ErrSchema naming the fix; WithAutoMigrate creates it;
// the statements of SchemaSQL make a schema NewBackend accepts.
func TestOpenAndSchemaSQL(t *testing.T) {
	admin, table := adminAndTable(t)
	ctx := ctxT(t)
	cfg, err := mysqllock.ParseDSN(testDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, dsn := range []string{testDSN(t), cfg.FormatDSN()} {
		l, err := mysqllock.Open(ctx, dsn, mysqllock.WithTable(table), mysqllock.WithClientOptions(core.WithDefaults(core.WithOwner("opened"))))
		if err != nil {
			t.Fatal(err)
		}
		testenv.OpenedLocker(t, ctx, l, "opened")
	}

	fresh := testenv.Name("dislock_open_")
	mysqltest.DropAtCleanup(t, admin, fresh)
	_, err = mysqllock.Open(ctx, testDSN(t), mysqllock.WithTable(fresh))
	if !errors.Is(err, mysqllock.ErrSchema) || !strings.Contains(err.Error(), "mysqllock.Migrate") {
		t.Fatalf("Open on a missing table: %v, want ErrSchema naming the fix", err)
	}
	l, err := mysqllock.Open(ctx, testDSN(t), mysqllock.WithTable(fresh), mysqllock.WithAutoMigrate())
	if err != nil {
		t.Fatalf("Open with WithAutoMigrate on a missing table: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	own := testenv.Name("dislock_schema_")
	mysqltest.DropAtCleanup(t, admin, own)
	stmts, err := mysqllock.SchemaSQL(own)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stmts {
		if _, err := admin.ExecContext(ctx, s); err != nil {
			t.Fatalf("SchemaSQL statement: %v", err)
		}
	}
	b, err := mysqllock.NewBackend(ctx, admin, mysqllock.WithTable(own))
	if err != nil {
		t.Fatalf("NewBackend on the schema of SchemaSQL: %v", err)
	}
	_ = b.Close()
	// A procedure of another version is reported, naming the fix.
	if _, err := admin.ExecContext(ctx, "ALTER PROCEDURE `"+own+"_acquire` COMMENT 'dislock mysqllock 0'"); err != nil {
		t.Fatal(err)
	}
	if _, err := mysqllock.NewBackend(ctx, admin, mysqllock.WithTable(own)); !errors.Is(err, mysqllock.ErrSchema) || !strings.Contains(err.Error(), "another version") {
		t.Fatalf("NewBackend with an old procedure: %v, want ErrSchema", err)
	}
	if b, err = mysqllock.NewBackend(ctx, admin, mysqllock.WithTable(own), mysqllock.WithAutoMigrate()); err != nil {
		t.Fatalf("WithAutoMigrate over an old procedure: %v", err)
	}
	_ = b.Close()
	// Tables of version 1 (no waiting flag on the lock table, no watcher
	// column on the waiters) are reported as made by an earlier version,
	// naming the fix, and Migrate upgrades them; the rows there were may
	// have waiters (flag 1).
	if b, err = mysqllock.NewBackend(ctx, admin, mysqllock.WithTable(own)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquire(ctx, core.AcquireRequest{Key: "old", Owner: "o", OwnerToken: "o", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	_ = b.Close()
	for _, s := range []string{"ALTER TABLE `" + own + "` DROP COLUMN waiting", "ALTER TABLE `" + own + "_waiters` DROP COLUMN watcher"} {
		if _, err := admin.ExecContext(ctx, s); err != nil {
			t.Fatal(err)
		}
		if _, err := mysqllock.NewBackend(ctx, admin, mysqllock.WithTable(own)); !errors.Is(err, mysqllock.ErrSchema) ||
			!strings.Contains(err.Error(), "earlier version") || !strings.Contains(err.Error(), "Migrate") {
			t.Fatalf("NewBackend after %s: %v, want ErrSchema naming Migrate", s, err)
		}
	}
	if err := mysqllock.Migrate(ctx, admin, mysqllock.WithTable(own)); err != nil {
		t.Fatalf("Migrate over tables of version 1: %v", err)
	}
	if b, err = mysqllock.NewBackend(ctx, admin, mysqllock.WithTable(own)); err != nil {
		t.Fatalf("NewBackend after Migrate upgraded the tables: %v", err)
	}
	_ = b.Close()
	var flag int
	if err := admin.QueryRowContext(ctx, "SELECT waiting FROM `"+own+"` WHERE `key` = 'old'").Scan(&flag); err != nil || flag != 1 {
		t.Fatalf("waiting flag of a row of version 1 after Migrate = %d (%v), want 1", flag, err)
	}
}

// Rule: bad options fail naming the option.
func TestOptionsNameTheField(t *testing.T) {
	ctx := ctxT(t)
	admin := newDB(t)
	for name, opt := range map[string]mysqllock.Option{
		"WithTable":        mysqllock.WithTable("bad-name"),
		"WithClaimTimeout": mysqllock.WithClaimTimeout(time.Millisecond),
	} {
		_, err := mysqllock.NewBackend(ctx, admin, opt)
		if !errors.Is(err, core.ErrInvalidOption) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v, want ErrInvalidOption naming it", name, err)
		}
	}
}

// Rule: a claim held up on the server past its claim timeout (here by a
// transaction that holds the key's row lock) is rolled back there, never
// applied after its caller gave up: the key is free once the blocker ends.
func TestClaimTimeoutRefusedOnServer(t *testing.T) {
	admin, table := adminAndTable(t)
	ctx := ctxT(t)
	b := newBackend(t, table, mysqllock.WithClaimTimeout(200*time.Millisecond))
	req := core.AcquireRequest{Key: "blocked", Owner: "o", OwnerToken: "first", TTL: time.Minute}
	if _, err := b.TryAcquire(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, core.ReleaseRequest{Key: "blocked", OwnerToken: "first"}); err != nil {
		t.Fatal(err)
	}
	tx := lockRow(t, admin, table, "blocked")
	req.OwnerToken = "second"
	start := time.Now()
	_, err := b.TryAcquire(ctx, req)
	if err == nil || errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("TryAcquire behind a row lock = %v, want a failure", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("TryAcquire took %v with a 200ms claim timeout", d)
	}
	// The duration under test, not a synchronisation: the server-side claim
	// must be still blocked when its claim timeout passes.
	time.Sleep(300 * time.Millisecond)
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	// The procedure, now past its timeout, rolls back: nothing claimed.
	deadline := time.Now().Add(b.ClaimBound())
	for time.Now().Before(deadline) {
		if info, ok, err := b.Inspect(ctx, "blocked"); err != nil || ok {
			t.Fatalf("Inspect = %+v, %v, %v: the timed-out claim took effect", info, ok, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Rule: a release decides on the clock read once it holds the row's lock:
// a lease that expires while its release waits for the row lock is
// answered as gone, not as released.
func TestReleaseDecidesAfterTheRowLock(t *testing.T) {
	admin, table := adminAndTable(t)
	ctx := ctxT(t)
	b := newBackend(t, table)
	req := core.AcquireRequest{Key: "late", Owner: "o", OwnerToken: "o", TTL: 300 * time.Millisecond}
	if _, err := b.TryAcquire(ctx, req); err != nil {
		t.Fatal(err)
	}
	tx := lockRow(t, admin, table, "late")
	done := make(chan error, 1)
	go func() { done <- b.Release(ctx, core.ReleaseRequest{Key: "late", OwnerToken: "o"}) }()
	// The duration under test, not a synchronisation: the lease must run
	// out while the release waits for the row.
	time.Sleep(600 * time.Millisecond)
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, core.ErrLeaseGone) {
		t.Fatalf("Release of a lease that expired while it waited for the row lock = %v, want ErrLeaseGone", err)
	}
}

// Rule: Migrate and the schema check read the catalogue without preparing
// statements on the server (MariaDB 10.11 was seen to crash executing a
// prepared read of information_schema.ROUTINES): on a pool of one
// connection, WithAutoMigrate then NewBackend prepare only the statements
// a Backend keeps (four CALLs, the two UPDATEs of a free key, the read of
// a key found held). A table named "database.table" is checked in that
// database, missing and outdated procedures still named with the fix.
func TestCatalogueReadsNotPrepared(t *testing.T) {
	ctx := ctxT(t)
	db := newDB(t)
	db.SetMaxOpenConns(1)
	var dbName string
	if err := db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&dbName); err != nil {
		t.Fatal(err)
	}
	own := testenv.Name("dislock_cat_")
	mysqltest.DropAtCleanup(t, db, own)
	prepared := func() int64 { return sessionStatus(t, db, "Com_stmt_prepare") }
	before := prepared()
	b, err := mysqllock.NewBackend(ctx, db, mysqllock.WithTable(dbName+"."+own), mysqllock.WithAutoMigrate())
	if err != nil {
		t.Fatalf("NewBackend with WithAutoMigrate on %s.%s: %v", dbName, own, err)
	}
	_ = b.Close()
	if got := prepared() - before; got != 7 {
		t.Errorf("Migrate and NewBackend prepared %d statements, want 7 (the CALLs, UPDATEs and SELECT a Backend keeps)", got)
	}
	if _, err := db.ExecContext(ctx, "ALTER PROCEDURE `"+own+"_renew` COMMENT 'dislock mysqllock 0'"); err != nil {
		t.Fatal(err)
	}
	if _, err := mysqllock.NewBackend(ctx, db, mysqllock.WithTable(dbName+"."+own)); !errors.Is(err, mysqllock.ErrSchema) ||
		!strings.Contains(err.Error(), "another version") || !strings.Contains(err.Error(), "mysqllock.Migrate") {
		t.Fatalf("NewBackend with an old procedure: %v, want ErrSchema naming the fix", err)
	}
	if _, err := db.ExecContext(ctx, "DROP PROCEDURE `"+own+"_renew`"); err != nil {
		t.Fatal(err)
	}
	if _, err := mysqllock.NewBackend(ctx, db, mysqllock.WithTable(own)); !errors.Is(err, mysqllock.ErrSchema) ||
		!strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), "mysqllock.Migrate") {
		t.Fatalf("NewBackend with a missing procedure: %v, want ErrSchema naming the fix", err)
	}
	if err := mysqllock.Migrate(ctx, db, mysqllock.WithTable(dbName+"."+own)); err != nil {
		t.Fatalf("Migrate over a missing procedure: %v", err)
	}
	if b, err = mysqllock.NewBackend(ctx, db, mysqllock.WithTable(own)); err != nil {
		t.Fatalf("NewBackend after Migrate: %v", err)
	}
	_ = b.Close()
}
