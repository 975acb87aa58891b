package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/pg"
)

// At the default level (WARNING) a run that succeeds and a run skipped
// because the lock is held print nothing, so that cron mails nothing; INFO
// logs the start, the exit and the skip.
func TestQuietByDefault(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		env := f.baseEnv("LOCK_KEY="+f.newKey(t), "LOCK_STRATEGY=schedule,lease", "CRON_SCHEDULE=@hourly")
		p := run(t, env, urlVar, "true")
		expectCode(t, p, 0)
		if out := p.output(); out != "" {
			t.Errorf("a successful run printed:\n%s", out)
		}
		p = run(t, env, urlVar, "true")
		expectCode(t, p, 0)
		if out := p.output(); out != "" {
			t.Errorf("a run skipped in a slot that has run printed:\n%s", out)
		}
		p = run(t, append(env, "CRONJOB_LOCK_LOG_LEVEL=INFO"), urlVar, "true")
		expectCode(t, p, 0)
		if !strings.Contains(p.stderr.String(), "level=INFO") || !strings.Contains(p.stderr.String(), "already run") {
			t.Errorf("INFO does not log the skip:\n%s", p.output())
		}

		env = f.baseEnv("LOCK_KEY="+f.newKey(t), "LOCK_STRATEGY=lease", "CRONJOB_LOCK_LOG_LEVEL=info")
		p = run(t, env, urlVar, "true")
		expectCode(t, p, 0)
		for _, want := range []string{"command started", "command exited"} {
			if !strings.Contains(p.stderr.String(), want) {
				t.Errorf("INFO does not log %q:\n%s", want, p.stderr.String())
			}
		}
	})
}

// A second start in a slot says that the slot has already run, when and by
// whom it was started, not that the lock is "held elsewhere" by a process
// that has exited.
func TestSlotAlreadyRun(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		dir := t.TempDir()
		pidFile := filepath.Join(dir, "pid")
		env := f.baseEnv("LOCK_KEY="+f.newKey(t), "CRON_SCHEDULE=@hourly", "CRONJOB_LOCK_LOG_LEVEL=INFO")
		before := time.Now().Add(-2 * time.Second)
		first := run(t, env, urlVar, "sh", "-c", "echo $PPID > "+pidFile)
		expectCode(t, first, 0)
		pid := waitFile(t, pidFile, time.Second)
		second := run(t, env, urlVar, "true")
		expectCode(t, second, 0)
		msg := second.stderr.String()
		if !strings.Contains(msg, "this schedule slot has already run") || strings.Contains(msg, "held elsewhere") {
			t.Fatalf("second run:\n%s", msg)
		}
		if !strings.Contains(msg, ":"+pid+" ") {
			t.Errorf("the message does not name the first run's process %s:\n%s", pid, msg)
		}
		i := strings.Index(msg, "started at ")
		if i < 0 {
			t.Fatalf("the message does not say when the slot was started:\n%s", msg)
		}
		ts, _, _ := strings.Cut(msg[i+len("started at "):], " ")
		at, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil || at.Before(before) || at.After(time.Now().Add(2*time.Second)) {
			t.Errorf("start time %q (%v), want about now", ts, err)
		}
	})
}

// A URL passed in place of the variable's name is never printed, with or
// without a password, and the command does not run.
func TestURLNotPrinted(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	var f *fixture
	env := f.baseEnv("LOCK_KEY=k", "CRON_SCHEDULE=@hourly", "CRONJOB_LOCK_LOG_LEVEL=DEBUG")
	for _, u := range []string{
		"postgres://user:" + sentinel + "@db-host-7q.example:5432/app",
		"postgres://db-host-7q.example/app",
		"redis://db-host-7q.example:6379/0",
	} {
		for _, args := range [][]string{{u, "touch", marker}, {"status", "--url-env", u, "k"}, {"list", "--url-env=" + u}} {
			p := run(t, env, args...)
			expectCode(t, p, exitUsage)
			if out := p.output(); strings.Contains(out, "db-host-7q") || strings.Contains(out, sentinel) {
				t.Errorf("%q: the URL is printed:\n%s", args[0], out)
			}
			if !strings.Contains(p.stderr.String(), "URL_ENV") {
				t.Errorf("%q: the error does not name URL_ENV:\n%s", args[0], p.stderr.String())
			}
		}
	}
	if exists(marker) {
		t.Fatal("the command ran")
	}
}

// status and list print the same columns in the same format.
func TestStatusListFormat(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		key := f.newKey(t)
		env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease")
		holder := startHolding(t, env, "sleep 300")
		st := run(t, f.baseEnv(), "status", "--url-env", urlVar, leasePrefix+key)
		expectCode(t, st, 0)
		ls := run(t, f.baseEnv(), "list", "--url-env", urlVar, leasePrefix+key)
		expectCode(t, ls, 0)
		columns := func(line string) []string {
			var names []string
			for i, field := range strings.Split(strings.TrimSpace(line), "\t") {
				name, _, _ := strings.Cut(field, "=")
				if i == 0 {
					name = "KEY:" + name
				}
				names = append(names, name)
			}
			return names
		}
		want := []string{"KEY:" + leasePrefix + key, "held", "owner", "token", "acquired_at", "expires_at", "remaining"}
		for name, out := range map[string]string{"status": st.stdout.String(), "list": ls.stdout.String()} {
			if got := columns(out); strings.Join(got, " ") != strings.Join(want, " ") {
				t.Errorf("%s prints columns %q, want %q:\n%s", name, got, want, out)
			}
		}
		holder.cmd.Process.Signal(syscall.SIGTERM) // forwarded to the group
		holder.wait(t, 20*time.Second)
	})
}

// schemaFixture is PostgreSQL with a schema of its own (named prefix...),
// first on the search path, to hold the test's default table; conn is a
// connection for the test's own checks, and schema the schema's name.
func schemaFixture(t *testing.T, prefix string) (f *fixture, conn *pgx.Conn, schema string) {
	u := testenv.PG(t)
	conn = pgConn(t, u)
	schema = testenv.Name(prefix)
	if _, err := conn.Exec(context.Background(), "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	return &fixture{url: testenv.PGParam(t, u, "search_path", schema)}, conn, schema
}

// A LOCK_TABLE that does not exist is exit 2 with the statement that creates
// it, and nothing is created; DISLOCK_CREATE_TABLE=1 (or --create-table)
// lets the run create it; status, list and release never create a table;
// the default table is created by the first run.
// On MySQL, "exit 2 shows" names mysqllock.SchemaSQL instead.
func TestLockTableNotCreated(t *testing.T) {
	t.Run("pg", func(t *testing.T) {
		ctx := context.Background()
		f, conn, schema := schemaFixture(t, "dislock_cli_schema_")
		lockTableNotCreated(t, f, "CREATE TABLE", func(name string) bool {
			var ok bool
			if err := conn.QueryRow(ctx, "SELECT to_regclass($1::text) IS NOT NULL", pgx.Identifier{schema, name}.Sanitize()).Scan(&ok); err != nil {
				t.Fatal(err)
			}
			return ok
		})
	})
	t.Run("mysql", func(t *testing.T) {
		f, tableExists := mysqlDatabaseFixture(t, "dislock_cli_schema_")
		lockTableNotCreated(t, f, "mysqllock.SchemaSQL", tableExists)
	})
}

// lockTableNotCreated is TestLockTableNotCreated on f, a database without
// lock tables; the error of a missing LOCK_TABLE shows create.
func lockTableNotCreated(t *testing.T, f *fixture, create string, tableExists func(name string) bool) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	typo := "dislock_lokcs"

	// Operators create nothing, not even the default table: without it
	// every lock is free; a named table that does not exist is exit 2.
	for _, tc := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"status", "--url-env", urlVar, "k"}, exitFree, "k\tfree\n"},
		{[]string{"list", "--url-env", urlVar}, 0, ""},
		{[]string{"release", "--force", "--url-env", urlVar, "k"}, 0, "k\tfree\n"},
		{[]string{"list", "--url-env", urlVar, "--table", typo}, exitUsage, ""},
	} {
		p := run(t, f.baseEnv(), tc.args...)
		expectCode(t, p, tc.code)
		if p.stdout.String() != tc.out || tc.code == exitUsage && !strings.Contains(p.stderr.String(), "does not exist") {
			t.Errorf("%v: %s", tc.args, p.output())
		}
	}
	if tableExists("dislock_locks") || tableExists(typo) {
		t.Fatal("an operator subcommand created a table")
	}

	// A mistyped LOCK_TABLE: exit 2 with the CREATE statement; nothing ran.
	// Asked explicitly, the run creates it.
	env := f.baseEnv("LOCK_KEY="+f.newKey(t), "CRON_SCHEDULE=@hourly", "LOCK_TABLE="+typo)
	refusedUntilCreateTable(t, env, marker, func() bool { return tableExists(typo) },
		"LOCK_TABLE", create, typo, "DISLOCK_CREATE_TABLE")
	other := typo + "_2"
	expectCode(t, run(t, f.baseEnv("LOCK_KEY=k", "CRON_SCHEDULE=@hourly"), "--table", other, "--create-table", urlVar, "true"), 0)
	if !tableExists(other) {
		t.Fatal("--create-table did not create the table")
	}

	// The default table is created by the first run.
	expectCode(t, run(t, f.baseEnv("LOCK_KEY="+f.newKey(t), "CRON_SCHEDULE=@hourly"), urlVar, "touch", marker), 0)
	if !tableExists("dislock_locks") || !exists(marker) {
		t.Fatal("the first run did not create the default table")
	}
	expectCode(t, run(t, f.baseEnv(), "list", "--url-env", urlVar), 0)
}

// A lock table of an earlier version (no waiters column) is brought up to
// date by a run that may create the table — the default table, or
// DISLOCK_CREATE_TABLE=1 — and is otherwise exit 2 naming the statement that
// adds the column; nothing is altered then.
func TestLockTableUpgraded(t *testing.T) {
	ctx := context.Background()
	f, conn, schema := schemaFixture(t, "dislock_cli_upgrade_")
	oldTable := func(name string) {
		t.Helper()
		ddl, err := pg.SchemaSQL(schema+"."+name, false, false)
		if err != nil {
			t.Fatal(err)
		}
		q := pgx.Identifier{schema, name}.Sanitize()
		if _, err := conn.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "ALTER TABLE "+q+" DROP COLUMN waiters"); err != nil {
			t.Fatal(err)
		}
	}
	hasWaiters := func(name string) bool {
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute
WHERE attrelid = to_regclass($1::text) AND attname = 'waiters' AND NOT attisdropped)`,
			pgx.Identifier{schema, name}.Sanitize()).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	marker := filepath.Join(t.TempDir(), "ran")

	// A named table: exit 2 with the fix, the table untouched. Asked to
	// create what is missing, the run adds the column and runs.
	named := "old_locks"
	oldTable(named)
	env := f.baseEnv("LOCK_KEY="+f.newKey(t), "CRON_SCHEDULE=@hourly", "LOCK_TABLE="+named)
	refusedUntilCreateTable(t, env, marker, func() bool { return hasWaiters(named) },
		"ADD COLUMN IF NOT EXISTS waiters")

	// The default table of an earlier version is brought up to date.
	oldTable("dislock_locks")
	expectCode(t, run(t, f.baseEnv("LOCK_KEY="+f.newKey(t), "CRON_SCHEDULE=@hourly"), urlVar, "touch", marker), 0)
	if !hasWaiters("dislock_locks") || !exists(marker) {
		t.Fatal("a run on the default table of an earlier version did not add the column and run")
	}
}

// LOCK_TABLE given to a backend without tables is noted at DEBUG only: at
// the default level a run prints nothing, so cron does not mail every run.
func TestLockTableIgnoredQuietly(t *testing.T) {
	f := redisFixture(t)
	env := f.baseEnv("LOCK_KEY="+f.newKey(t), "LOCK_STRATEGY=lease", "LOCK_TABLE=jobs_locks")
	p := run(t, env, urlVar, "true")
	expectCode(t, p, 0)
	if out := p.output(); out != "" {
		t.Errorf("a successful run with LOCK_TABLE on Redis printed:\n%s", out)
	}
	p = run(t, append(env, "CRONJOB_LOCK_LOG_LEVEL=DEBUG"), urlVar, "true")
	expectCode(t, p, 0)
	if !strings.Contains(p.stderr.String(), "LOCK_TABLE is ignored by the Redis backend") {
		t.Errorf("DEBUG does not note the ignored LOCK_TABLE:\n%s", p.stderr.String())
	}
}

// refusedUntilCreateTable runs touch marker under env, whose LOCK_TABLE is
// missing or of an earlier version: the run is exit 2 with an error that
// names each of want, leaves the table as it was (ready stays false) and
// runs nothing. With DISLOCK_CREATE_TABLE=1 the same run makes the table
// ready and runs; marker is removed again afterwards.
func refusedUntilCreateTable(t *testing.T, env []string, marker string, ready func() bool, want ...string) {
	t.Helper()
	p := run(t, env, urlVar, "touch", marker)
	expectCode(t, p, exitUsage)
	for _, w := range want {
		if !strings.Contains(p.stderr.String(), w) {
			t.Errorf("the error lacks %q: %s", w, p.stderr.String())
		}
	}
	if ready() || exists(marker) {
		t.Fatal("the table was created or altered, or the command ran")
	}
	expectCode(t, run(t, append(env, "DISLOCK_CREATE_TABLE=1"), urlVar, "touch", marker), 0)
	if !ready() || !exists(marker) {
		t.Fatal("DISLOCK_CREATE_TABLE=1 did not make the table ready and run")
	}
	os.Remove(marker)
}
