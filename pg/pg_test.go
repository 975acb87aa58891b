package pg_test

import (
	"context"
	"errors"
	"net"
	"runtime"
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

// Rule: two Lockers on two separate pools (two processes) exclude each other.
func TestTwoPoolsExclude(t *testing.T) {
	table := freshTable(t)
	a := newClient(t, newBackend(t, table))
	b := newClient(t, newBackend(t, table))
	ctx := ctxT(t)
	s := testenv.Hold(t, ctx, a, "k")
	if _, err := b.TryAcquire(ctx, "k"); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("second pool acquired a held lock: %v", err)
	}
	if err := s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	s2, err := b.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	if s2.Token() <= s.Token() {
		t.Errorf("token went from %d to %d", s.Token(), s2.Token())
	}
	_ = s2.Release(ctx)
}

// Rule: 16 contenders on one key with a shared counter lose no update.
func TestCounter16Contenders(t *testing.T) {
	table := freshTable(t)
	lockers := []*core.Client{
		newClient(t, newBackend(t, table)),
		newClient(t, newBackend(t, table)),
	}
	const workers, rounds = 16, 5
	var counter atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	ctx := ctxT(t)
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := lockers[i%len(lockers)]
			for range rounds {
				err := core.Do(ctx, l, "counter", func(ctx context.Context) error {
					v := counter.Load() // read-modify-write that only the lock protects
					runtime.Gosched()
					counter.Store(v + 1)
					return nil
				}, core.TTL(5*time.Second))
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := counter.Load(); got != workers*rounds {
		t.Fatalf("counter = %d, want %d: updates were lost", got, workers*rounds)
	}
}

// Rule: a busy key is answered by a read: the row is neither written nor
// locked by a failed try.
func TestBusyTryWritesNothing(t *testing.T) {
	admin, table := adminAndTable(t)
	ident := quoted(table)
	a := newClient(t, newBackend(t, table))
	b := newBackend(t, table)
	ctx := ctxT(t)
	s := testenv.Hold(t, ctx, a, "hot", core.TTL(10*time.Second))
	defer s.Release(ctx)
	var xmin, xmax string
	read := func() (string, string) {
		var mn, mx string
		if err := admin.QueryRow(ctx, `SELECT xmin::text, xmax::text FROM `+ident+` WHERE key = 'hot'`).Scan(&mn, &mx); err != nil {
			t.Fatal(err)
		}
		return mn, mx
	}
	xmin, xmax = read()
	for range 20 {
		_, err := b.TryAcquire(ctx, core.AcquireRequest{Key: "hot", Owner: "b", OwnerToken: "tok-b", TTL: time.Second})
		var na *core.NotAcquiredError
		if !errors.As(err, &na) || na.Holder == nil || na.Holder.Token != s.Token() || na.Holder.Remaining <= 0 {
			t.Fatalf("busy answer = %v", err)
		}
	}
	if mn, mx := read(); mn != xmin || mx != xmax {
		t.Fatalf("failed tries touched the row: xmin %s→%s xmax %s→%s", xmin, mn, xmax, mx)
	}
}

// Rule: table names are identifiers, never SQL: an injection attempt creates
// an oddly named table and nothing else; quotes in names work.
func TestBadTableNames(t *testing.T) {
	admin := newPool(t, nil)
	ctx := ctxT(t)
	canary := scratchTable(t, admin, "canary_")
	if _, err := admin.Exec(ctx, `CREATE TABLE `+canary+` (x int)`); err != nil {
		t.Fatal(err)
	}
	// A schema-qualified name in the schema the test server's URL uses
	// (its search_path), which need not be public.
	var schema string
	if err := admin.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatalf("current_schema: %v", err)
	}
	suffix := testenv.Name("")
	for _, name := range []string{
		"locks; DROP TABLE " + canary + ";--" + suffix,
		`odd "name" ` + suffix,
		schema + `.Mixed Case ` + suffix,
	} {
		t.Run("", func(t *testing.T) {
			parts := strings.SplitN(name, ".", 2)
			dropAtCleanup(t, admin, pgx.Identifier(parts))
			pool := newPool(t, nil)
			l, err := pg.New(ctx, pool, pg.WithTable(name), pg.WithAutoMigrate())
			if err != nil {
				t.Fatalf("table %q: %v", name, err)
			}
			defer l.Close()
			s, err := l.TryAcquire(ctx, "k")
			if err != nil {
				t.Fatalf("table %q: %v", name, err)
			}
			if err := s.Release(ctx); err != nil {
				t.Fatal(err)
			}
			var n int
			if err := admin.QueryRow(ctx, `SELECT count(*) FROM `+canary).Scan(&n); err != nil {
				t.Fatalf("canary gone: %v", err)
			}
		})
	}
	for _, bad := range []string{"", ".", "x.", ".x", "a\x00b", strings.Repeat("x", 64), "s." + strings.Repeat("y", 64), "\xff"} {
		_, err := pg.NewBackend(ctx, admin, pg.WithTable(bad))
		if !errors.Is(err, core.ErrInvalidOption) || !strings.Contains(err.Error(), "WithTable") {
			t.Errorf("WithTable(%q) = %v, want ErrInvalidOption naming WithTable", bad, err)
		}
	}
}

// Rule: keys up to core.MaxKeyLen bytes work; longer ones are rejected
// before any SQL is sent.
func TestKeyLimits(t *testing.T) {
	table := freshTable(t)
	b := newBackend(t, table)
	l := newClient(t, b)
	ctx := ctxT(t)
	key := strings.Repeat("é", core.MaxKeyLen/2) // 1024 bytes
	s, err := l.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("key at the limit: %v", err)
	}
	info, held, err := l.Inspect(ctx, key)
	if err != nil || !held || info.Token != s.Token() {
		t.Fatalf("Inspect = %+v %v %v", info, held, err)
	}
	if err := s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{key + "x", "", "a\x00b", "\xff"} {
		if _, err := l.TryAcquire(ctx, bad); !errors.Is(err, core.ErrInvalidKey) {
			t.Errorf("Locker key %q: %v", bad, err)
		}
		if _, err := b.TryAcquire(ctx, core.AcquireRequest{Key: bad, OwnerToken: "t", TTL: time.Second}); !errors.Is(err, core.ErrInvalidKey) {
			t.Errorf("Backend key %q: %v", bad, err)
		}
	}
}

// Rule: a wrong or missing table is found at start-up with an error naming
// the table and the fix.
func TestSchemaCheck(t *testing.T) {
	admin := newPool(t, nil)
	ctx := ctxT(t)
	cases := []struct {
		name, ddl, want string
		opts            []pg.Option
	}{
		{"missing", "", "does not exist", nil},
		{"timestamp", `CREATE TABLE %s (key text PRIMARY KEY, owner text NOT NULL, holder text NOT NULL,
			token bigint GENERATED BY DEFAULT AS IDENTITY, acquired_at timestamptz NOT NULL, expire_at timestamp NOT NULL)`,
			"expire_at is timestamp without time zone", nil},
		{"legacy timestamp", `CREATE TABLE %s (key text PRIMARY KEY, value text NOT NULL, expire_at timestamp NOT NULL)`,
			"expire_at is timestamp without time zone", []pg.Option{pg.WithLegacyTable()}},
		{"missing column", `CREATE TABLE %s (key text PRIMARY KEY, value text NOT NULL, expire_at timestamptz NOT NULL)`,
			"column owner is missing", nil},
		{"no key index", `CREATE TABLE %s (key text, value text NOT NULL, expire_at timestamptz NOT NULL)`,
			"no unique index", []pg.Option{pg.WithLegacyTable()}},
		{"no token default", `CREATE TABLE %s (key text PRIMARY KEY, owner text NOT NULL, holder text NOT NULL,
			token bigint NOT NULL, acquired_at timestamptz NOT NULL, expire_at timestamptz NOT NULL)`,
			"has no default", nil},
		{"view", `CREATE VIEW %s AS SELECT 1 AS x`, "is not a table", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			name := testenv.Name("dislock_bad_")
			ident := quoted(name)
			if c.ddl != "" {
				if _, err := admin.Exec(ctx, strings.Replace(c.ddl, "%s", ident, 1)); err != nil {
					t.Fatal(err)
				}
				kind := "TABLE"
				if c.name == "view" {
					kind = "VIEW"
				}
				t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP "+kind+" IF EXISTS "+ident) })
			}
			_, err := pg.NewBackend(ctx, admin, append([]pg.Option{pg.WithTable(name)}, c.opts...)...)
			if !errors.Is(err, pg.ErrSchema) || !strings.Contains(err.Error(), c.want) ||
				!strings.Contains(err.Error(), ident) || !strings.Contains(err.Error(), "fix") {
				t.Fatalf("NewBackend = %v, want ErrSchema naming %s, %q and a fix", err, ident, c.want)
			}
		})
	}
}

// Rule: a role without DELETE on the table is told so at start-up.
func TestRoleWithoutDelete(t *testing.T) {
	needDirect(t, "it connects as a role of its own")
	admin, table := adminAndTable(t)
	ident := quoted(table)
	ctx := ctxT(t)
	role, pool := loginRole(t, admin, `SELECT, INSERT, UPDATE ON `+ident)
	_, err := pg.NewBackend(ctx, pool, pg.WithTable(table))
	if !errors.Is(err, pg.ErrSchema) || !strings.Contains(err.Error(), "DELETE") || !strings.Contains(err.Error(), ident) {
		t.Fatalf("NewBackend = %v, want ErrSchema naming DELETE and %s", err, ident)
	}
	if _, err := admin.Exec(ctx, `GRANT DELETE ON `+ident+` TO `+role); err != nil {
		t.Fatal(err)
	}
	l, err := pg.New(ctx, pool, pg.WithTable(table))
	if err != nil {
		t.Fatalf("with all four privileges: %v", err)
	}
	defer l.Close()
	s, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("least-privilege role cannot acquire: %v", err)
	}
	_ = s.Release(ctx)
}

// Rule: clients whose sessions use different TimeZone settings never both
// hold a lock, and agree on its expiry.
func TestTimeZones(t *testing.T) {
	table := freshTable(t)
	zone := func(tz string) *core.Client {
		return newClient(t, newBackendPool(t, table, func(c *pgxpool.Config) {
			c.ConnConfig.RuntimeParams["timezone"] = tz
		}))
	}
	east, west := zone("Pacific/Kiritimati"), zone("Pacific/Pago_Pago") // UTC+14, UTC-11
	ctx := ctxT(t)
	for i, pair := range [][2]*core.Client{{east, west}, {west, east}} {
		s, err := pair[0].TryAcquire(ctx, "tz", core.TTL(5*time.Second))
		if err != nil {
			t.Fatalf("pair %d: %v", i, err)
		}
		_, err = pair[1].TryAcquire(ctx, "tz")
		var na *core.NotAcquiredError
		if !errors.As(err, &na) {
			t.Fatalf("pair %d: a client in another time zone acquired a held lock: %v", i, err)
		}
		if na.Holder == nil || na.Holder.Remaining <= 0 || na.Holder.Remaining > 5*time.Second {
			t.Fatalf("pair %d: holder %+v", i, na.Holder)
		}
		if err := s.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Rule: Watch returns an error, not a hang, when LISTEN is unavailable, and
// ErrUnsupported under WithoutListen.
func TestWatchUnavailable(t *testing.T) {
	admin, table := adminAndTable(t)
	ctx := ctxT(t)
	// The test server's config as given, and with sslmode=prefer (the
	// default when the URL has none), whose TLS fallbacks each carry an
	// address of their own.
	preferCfg, err := pgx.ParseConfig(testenv.PGParam(t, testenv.PG(t), "sslmode", "prefer"))
	if err != nil {
		t.Fatal("DISLOCK_TEST_PG with sslmode=prefer cannot be parsed")
	}
	if preferCfg.Host != admin.Config().ConnConfig.Host {
		t.Fatalf("sslmode=prefer config: host %q, want the test server's", preferCfg.Host)
	}
	var b *pg.Backend
	for _, base := range []*pgx.ConnConfig{admin.Config().ConnConfig, preferCfg} {
		cc := base.Copy()
		cc.Port = 1 // nothing listens there
		for _, fb := range cc.Fallbacks {
			fb.Port = 1
		}
		cc.ConnectTimeout = 2 * time.Second
		b = newBackend(t, table, pg.WithListenConfig(cc))
		done := make(chan error, 1)
		go func() { done <- b.Watch(ctx, func() { t.Error("ready called") }, func(string) {}) }()
		select {
		case err := <-done:
			if err == nil {
				t.Fatal("Watch returned nil")
			}
		case <-time.After(15 * time.Second):
			t.Fatal("Watch hangs when LISTEN is unavailable")
		}
	}
	b2 := newBackend(t, table, pg.WithoutListen())
	if err := b2.Watch(ctx, func() {}, func(string) {}); !errors.Is(err, core.ErrUnsupported) {
		t.Fatalf("WithoutListen: Watch = %v", err)
	}
	// A Locker still acquires after a release, by polling.
	l1, l2 := newClient(t, b2), newClient(t, b)
	s := testenv.Hold(t, ctx, l1, "poll")
	got := testenv.AcquireAsync(ctx, l2, "poll", core.Backoff(5*time.Millisecond, 50*time.Millisecond))
	_ = s.Release(ctx)
	if r := <-got; r.Err != nil {
		t.Fatalf("polling waiter: %v", r.Err)
	}
}

// Rule: Open never puts the connection string in an error.
//
// The outcome depends on nothing outside the test: every target that could
// connect at all names a port the test saw closed, and Open looks for a lock
// table no run creates, so that even a target that did reach a server (a
// port taken in between, a default Unix socket) fails on the missing table,
// whatever earlier runs left in the OS user's database.
func TestOpenKeepsSecrets(t *testing.T) {
	const secret = testenv.Secret
	host, port, err := net.SplitHostPort(testenv.ClosedAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	table := testenv.Name("dislock_nowhere_")
	open := func(ctx context.Context, dsn string, opts ...pg.Option) (*core.Client, error) {
		return pg.Open(ctx, dsn, append(opts, pg.WithTable(table))...)
	}
	// A TCP target, so that the bad sslmode is a parse error: on a Unix
	// socket pgx ignores sslmode.
	badSSLMode := "host=" + host + " port=" + port + " password=" + secret + " sslmode=nonsense"
	testenv.OpenKeepsSecret(t, open,
		"postgres://user:"+secret+"@"+net.JoinHostPort(host, port)+"/db?connect_timeout=1",
		"postgres://user:"+secret+"@127.0.0.1:bad/db",
		"host="+host+" port="+port+" password="+secret+" connect_timeout=1",
		badSSLMode,
		// No host: the default Unix socket and the OS user's database.
		"password="+secret+" connect_timeout=1",
	)
	// The bad sslmode reaches the parser, whose own message would quote
	// the connection string, rather than failing to connect.
	if _, err := open(ctxT(t), badSSLMode); !errors.Is(err, core.ErrInvalidOption) {
		t.Errorf("bad sslmode: %v, want an error matching ErrInvalidOption", err)
	}
}

// Rule: Open returns a Locker, as New does, that owns its pool: its Close
// closes the pool; OpenBackend's Backend.Close does the same (goleak in
// TestMain catches a pool left running); WithAutoMigrate makes Open work on
// a database without the table; SchemaSQL is what Migrate runs.
func TestOpenAndSchemaSQL(t *testing.T) {
	admin, table := adminAndTable(t)
	ctx := ctxT(t)
	var l core.Locker
	l, err := pg.Open(ctx, testURL(t), pg.WithTable(table), pg.WithClientOptions(core.WithDefaults(core.WithOwner("opened"))))
	if err != nil {
		t.Fatal(err)
	}
	testenv.OpenedLocker(t, ctx, l, "opened")

	b, err := pg.OpenBackend(ctx, testURL(t), pg.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	fresh := scratchTable(t, admin, "dislock_open_")
	if _, err := pg.Open(ctx, testURL(t), pg.WithTable(fresh)); !errors.Is(err, pg.ErrSchema) {
		t.Fatalf("Open on a missing table: %v, want ErrSchema", err)
	}
	l, err = pg.Open(ctx, testURL(t), pg.WithTable(fresh), pg.WithAutoMigrate())
	if err != nil {
		t.Fatalf("Open with WithAutoMigrate on a missing table: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	sql, err := pg.SchemaSQL("app.locks", false, true)
	if err != nil || !strings.Contains(sql, `CREATE UNLOGGED TABLE IF NOT EXISTS "app"."locks"`) || !strings.Contains(sql, "timestamptz") {
		t.Fatalf("SchemaSQL = %q, %v", sql, err)
	}
	if _, err := pg.SchemaSQL("bad\x00", false, false); !errors.Is(err, core.ErrInvalidOption) {
		t.Fatalf("SchemaSQL(NUL) = %v", err)
	}
}

// Rule: errors carry one prefix per layer: core's "dislock: pg: acquire
// "k": " (or release, or the store clock) wraps the driver's error, and the
// backend adds no "pg: acquire:" layer of its own.
func TestErrorPrefixOnce(t *testing.T) {
	table := freshTable(t)
	pool := newPool(t, nil)
	ctx := ctxT(t)
	l, err := pg.New(ctx, pool, pg.WithTable(table), pg.WithoutListen())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	pool.Close() // every call now fails in the driver
	for _, opts := range [][]core.Option{{core.TTL(core.DefaultTTL)}, {core.ForSlot(core.Every(time.Hour))}} {
		_, err := l.TryAcquire(ctx, "prefix-once", opts...)
		if err == nil {
			t.Fatal("acquired on a closed pool")
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "dislock: pg: ") || strings.Count(msg, "pg:") != 1 || strings.Count(msg, "acquire") > 1 {
			t.Errorf("error %q: want one dislock: pg: prefix and no other layer naming the backend", msg)
		}
	}
}

// Rule: a refused connection fails the constructor at once, naming the
// cause, and the password of the URL appears in no message.
func TestConnectionRefusedFailsFast(t *testing.T) {
	t.Parallel()
	addr := testenv.ClosedAddr(t)
	const password = "s3cret-pw"
	pool, err := pgxpool.New(context.Background(), "postgres://dislock:"+password+"@"+addr+"/db?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	l, err := pg.New(ctx, pool)
	took := time.Since(start)
	if err == nil {
		l.Close()
		t.Fatal("New connected to a closed port")
	}
	if msg := err.Error(); took > 5*time.Second || !strings.Contains(msg, "connection refused") || strings.Contains(msg, password) {
		t.Fatalf("New = %q after %v, want the refusal named within 5s, without the password", msg, took)
	}
}

// Rule: on an empty database, the error names pg.Migrate as the fix, and
// the package-level pg.Migrate (which needs no Backend, since NewBackend
// refuses a missing table) creates what New then uses, semaphores included.
func TestPackageMigrate(t *testing.T) {
	admin := newPool(t, nil)
	ctx := ctxT(t)
	name := scratchTable(t, admin, "dislock_mig_")

	_, err := pg.New(ctx, admin, pg.WithTable(name))
	if !errors.Is(err, pg.ErrSchema) || !strings.Contains(err.Error(), "pg.Migrate(ctx, pool)") {
		t.Fatalf("New on a missing table = %v, want ErrSchema naming pg.Migrate(ctx, pool)", err)
	}
	if err := pg.Migrate(ctx, admin, pg.WithTable(name)); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	// Again: it is idempotent.
	if err := pg.Migrate(ctx, admin, pg.WithTable(name)); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	l, err := pg.New(ctx, admin, pg.WithTable(name))
	if err != nil {
		t.Fatalf("New after Migrate: %v", err)
	}
	defer l.Close()
	s, err := l.TryAcquire(ctx, "k", core.Limit(2))
	if err != nil {
		t.Fatalf("a semaphore permit on the migrated table: %v", err)
	}
	_ = s.Release(ctx)

	if err := pg.Migrate(ctx, nil); !errors.Is(err, core.ErrInvalidOption) {
		t.Errorf("Migrate(nil pool) = %v, want ErrInvalidOption", err)
	}
	if err := pg.Migrate(ctx, admin, pg.WithTable("")); !errors.Is(err, core.ErrInvalidOption) || !strings.Contains(err.Error(), "WithTable") {
		t.Errorf("Migrate(WithTable(\"\")) = %v, want ErrInvalidOption naming WithTable", err)
	}
}
