package main

import (
	"context"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/internal/testenv"
)

// expectOutage checks a run that met an outage: exit 1, its command not
// run, one line naming the setting of the URL and the backend, within a
// bound set by DISLOCK_TIMEOUT_SECONDS (1 s here), never the busy path.
func expectOutage(t *testing.T, p *proc, marker, backend string) {
	t.Helper()
	expectCode(t, p, exitFailure)
	if exists(marker) {
		t.Fatalf("the command ran: %s", p.output())
	}
	lines := strings.Split(strings.TrimSpace(p.stderr.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], urlVar) || !strings.Contains(lines[0], backend) {
		t.Fatalf("want one line naming %s and %s, got:\n%s", urlVar, backend, p.stderr.String())
	}
	if took := p.ended.Sub(p.started); took > 10*time.Second {
		t.Fatalf("gave up after %v, with DISLOCK_TIMEOUT_SECONDS=1", took)
	}
	noSentinel(t, p)
}

// A store that cannot be reached or used is exit 1 with one line, never
// the busy path (exit 0, or here the busy exit code 9): a TLS URL to a
// plaintext server, a server that never answers, a lock table held ACCESS
// EXCLUSIVE by a migration, a refused connection, a wrong password.
func TestOutageIsNotBusy(t *testing.T) {
	redisURL, err := url.Parse(testenv.Redis(t))
	if err != nil {
		t.Fatal(err)
	}
	silent := testenv.SilentServer(t)
	cases := []struct {
		name, url, backend, cause string
	}{
		{"RedissToPlaintext", "rediss://" + redisURL.Host + "/0", "redis", "no answer within 1s"},
		{"RedisNeverAnswers", "redis://" + silent + "/0", "redis", "no answer within 1s"},
		{"RedissNeverAnswers", "rediss://" + silent + "/0", "redis", "no answer within 1s"},
		{"PGNeverAnswers", "postgres://u:" + sentinel + "@" + silent + "/db?sslmode=disable", "pg", "no answer within 1s"},
		{"RedisRefused", "redis://127.0.0.1:1/0", "redis", "connection refused"},
		{"RedisWrongPassword", "redis://nobody:" + sentinel + "@" + redisURL.Host + "/0", "redis", "WRONGPASS"},
	}
	for _, tc := range cases {
		for _, strategy := range []string{"lease", "schedule"} {
			t.Run(tc.name+"/"+strategy, func(t *testing.T) {
				t.Parallel()
				marker := filepath.Join(t.TempDir(), "ran")
				var f *fixture
				env := f.baseEnv(urlVar+"="+tc.url, "LOCK_KEY="+testenv.Name("outage-"), "LOCK_STRATEGY="+strategy,
					"CRON_SCHEDULE=@hourly", "DISLOCK_TIMEOUT_SECONDS=1", "DISLOCK_BUSY_EXIT_CODE=9")
				p := run(t, env, urlVar, "touch", marker)
				expectOutage(t, p, marker, tc.backend)
				if !strings.Contains(p.stderr.String(), tc.cause) {
					t.Fatalf("the error does not say %q: %s", tc.cause, p.stderr.String())
				}
			})
		}
	}
	t.Run("PGTableLockedByMigration", func(t *testing.T) {
		t.Parallel()
		f := pgFixture(t)
		tx, err := pgConn(t, f.url).Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background())
		if _, err := tx.Exec(context.Background(), "LOCK TABLE "+pgx.Identifier{f.table()}.Sanitize()+" IN ACCESS EXCLUSIVE MODE"); err != nil {
			t.Fatal(err)
		}
		for _, strategy := range []string{"lease", "schedule"} {
			marker := filepath.Join(t.TempDir(), "ran")
			env := f.baseEnv("LOCK_KEY="+f.newKey(t), "LOCK_STRATEGY="+strategy, "CRON_SCHEDULE=@hourly",
				"DISLOCK_TIMEOUT_SECONDS=1", "DISLOCK_BUSY_EXIT_CODE=9")
			p := run(t, env, urlVar, "touch", marker)
			expectOutage(t, p, marker, "pg")
			if !strings.Contains(p.stderr.String(), "no answer within 1s") {
				t.Fatalf("the error does not say the store did not answer: %s", p.stderr.String())
			}
		}
	})
}

// A refused connection is a runtime failure (exit 1) that comes at once and
// names the cause, on every backend: before, Redis took 1.8 s (go-redis's
// dial retries), etcd 10 s (the undo of a claim that never left) and
// ZooKeeper 15 s ("no ZooKeeper session established: context deadline
// exceeded").
func TestConnectionRefusedFailsFast(t *testing.T) {
	addr := testenv.ClosedAddr(t)
	for _, u := range []string{
		"postgres://user:" + sentinel + "@" + addr + "/db?sslmode=disable",
		"mysql://user:" + sentinel + "@" + addr + "/db",
		"redis://user:" + sentinel + "@" + addr + "/0",
		"etcd://user:" + sentinel + "@" + addr,
		"zk://" + addr,
	} {
		var f *fixture
		env := f.baseEnv(urlVar+"="+u, "LOCK_KEY=k", "CRON_SCHEDULE=@hourly")
		start := time.Now()
		p := run(t, env, urlVar, "true")
		took := time.Since(start)
		expectCode(t, p, 1)
		noSentinel(t, p)
		if took > 5*time.Second || !strings.Contains(p.stderr.String(), "connection refused") {
			t.Errorf("%s: exit after %v, want within 5s naming the refusal: %s", scheme(u), took, p.stderr.String())
		}
	}
}
