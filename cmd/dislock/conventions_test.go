package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/internal/testenv"
)

// The conventions of the tools dislock stands beside: --version; status
// exit codes (0 held, 3 free), free on a database no run has used; a hint
// for a bare LOCK_KEY; crontab's 7 for Sunday; every bad log level, empty
// variable and host-less URL refused as such.
func TestConventions(t *testing.T) {
	t.Parallel()
	var none *fixture
	t.Run("Version", func(t *testing.T) {
		p := run(t, none.baseEnv(), "--version")
		expectCode(t, p, 0)
		if !strings.HasPrefix(p.stdout.String(), "dislock (devel) (go") {
			t.Fatalf("--version: %q", p.output())
		}
	})
	t.Run("StatusExitCodes", func(t *testing.T) {
		forEachBackend(t, func(t *testing.T, f *fixture) {
			key := f.newKey(t)
			holder := startHolding(t, f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease"), "exec sleep 300")
			held := run(t, f.baseEnv(), "status", "--url-env", urlVar, leasePrefix+key)
			expectCode(t, held, 0)
			free := run(t, f.baseEnv(), "status", "--url-env", urlVar, schedulePrefix+key)
			expectCode(t, free, exitFree)
			if !strings.Contains(free.stdout.String(), "\tfree") {
				t.Fatalf("status of a free key: %s", free.output())
			}
			bare := run(t, f.baseEnv(), "status", "--url-env", urlVar, key)
			expectCode(t, bare, exitFree)
			if !strings.Contains(bare.stderr.String(), leasePrefix+key) {
				t.Fatalf("no hint for a bare LOCK_KEY: %s", bare.output())
			}
			holder.cmd.Process.Signal(os.Interrupt)
			holder.wait(t, 20*time.Second)
		})
	})
	t.Run("StatusOnAFreshDatabase", func(t *testing.T) {
		// A schema no run has used stands for a fresh database: the
		// default table is looked up on the search path.
		fresh, _, _ := schemaFixture(t, "dislock_fresh_")
		p := run(t, fresh.baseEnv(), "status", "--url-env", urlVar, leasePrefix+"job")
		expectCode(t, p, exitFree)
		if !strings.Contains(p.stdout.String(), "\tfree") {
			t.Fatalf("status on a fresh database: %s", p.output())
		}
	})
	t.Run("SundaySeven", func(t *testing.T) {
		for _, spec := range []string{"0 0 * * 7", "0 0 * * 5-7", "0 0 * * 1-7/3"} {
			if _, _, err := parseSchedule(spec); err != nil {
				t.Errorf("%q: %v", spec, err)
			}
		}
		f := pgFixture(t)
		marker := filepath.Join(t.TempDir(), "ran")
		p := run(t, f.baseEnv("LOCK_KEY="+f.newKey(t), "CRON_SCHEDULE=0 0 * * 7"), urlVar, "touch", marker)
		expectCode(t, p, 0)
		if !exists(marker) {
			t.Fatalf("did not run: %s", p.output())
		}
	})
	t.Run("Refused", func(t *testing.T) {
		pgURL := testenv.PG(t)
		for _, tc := range []struct {
			name string
			env  []string
			want string
		}{
			{"VerboseLevel", []string{urlVar + "=" + pgURL, "CRONJOB_LOCK_LOG_LEVEL=verbose"}, "CRONJOB_LOCK_LOG_LEVEL"},
			{"EmptyURL", []string{urlVar + "="}, urlVar + " that should hold the backend URL is empty"},
			{"EmptyKey", []string{urlVar + "=" + pgURL, "LOCK_KEY="}, "LOCK_KEY is set but empty"},
			{"RedisNoHost", []string{urlVar + "=redis://"}, "names no host"},
			{"RedisNoHostDB", []string{urlVar + "=redis:///0"}, "names no host"},
			{"PGNoHost", []string{urlVar + "=postgres://"}, "names no host"},
			{"PGNoHostUser", []string{urlVar + "=postgres://user:" + sentinel + "@/db"}, "names no host"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				env := none.baseEnv(append([]string{"LOCK_KEY=" + testenv.Name("conv-"), "CRON_SCHEDULE=@hourly"}, tc.env...)...)
				p := run(t, env, urlVar, "true")
				expectCode(t, p, exitUsage)
				if !strings.Contains(p.stderr.String(), tc.want) {
					t.Fatalf("want %q in: %s", tc.want, p.output())
				}
				noSentinel(t, p)
			})
		}
	})
	t.Run("HelpDocuments", func(t *testing.T) {
		p := run(t, none.baseEnv(), "--help")
		for _, want := range []string{"128+N", "before the command starts", "3 when it is free", "--wait", "DISLOCK_TIMEOUT_SECONDS"} {
			if !strings.Contains(p.stdout.String(), want) {
				t.Errorf("--help does not say %q", want)
			}
		}
	})
}

// Errors say what is wrong: the reason a Redis or PostgreSQL URL cannot be
// parsed; a LOCK_KEY that is too long counted as the user typed it, with no
// "key: key:"; a key with a control character refused.
func TestErrorsSayWhat(t *testing.T) {
	t.Parallel()
	var none *fixture
	long := strings.Repeat("k", 1010)
	for _, tc := range []struct {
		name string
		env  []string
		want []string
		not  []string
	}{
		{"RedisPort", []string{urlVar + "=redis://u:" + sentinel + "@h:x/0"}, []string{"invalid port"}, nil},
		{"RedisDB", []string{urlVar + "=redis://h:6379/zero"}, []string{"invalid database number"}, nil},
		{"PGPort", []string{urlVar + "=postgres://u:" + sentinel + "@h:x/db"}, []string{"invalid port"}, nil},
		{"PGSSLMode", []string{urlVar + "=postgres://u:" + sentinel + "@h/db?sslmode=sometimes"}, []string{"sslmode"}, nil},
		{"KeyTooLong", []string{urlVar + "=redis://h:6379/0", "LOCK_KEY=" + long}, []string{"1010 bytes", "at most 1002"}, []string{"key: key:", "1032"}},
		{"KeyNewline", []string{urlVar + "=redis://h:6379/0", "LOCK_KEY=a\nb"}, []string{"LOCK_KEY", "control character"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := none.baseEnv(append([]string{"LOCK_KEY=errs", "CRON_SCHEDULE=@hourly"}, tc.env...)...)
			p := run(t, env, urlVar, "true")
			expectCode(t, p, exitUsage)
			for _, w := range tc.want {
				if !strings.Contains(p.stderr.String(), w) {
					t.Errorf("want %q in: %s", w, p.output())
				}
			}
			for _, w := range tc.not {
				if strings.Contains(p.stderr.String(), w) {
					t.Errorf("%q in: %s", w, p.output())
				}
			}
			noSentinel(t, p)
		})
	}
	st := run(t, none.baseEnv(urlVar+"=redis://h:6379/0"), "status", "--url-env", urlVar, "a\nb")
	expectCode(t, st, exitUsage)
}

// Redaction removes the password and the URL, and keeps user names and
// ordinary words: "user=postgres" in a driver's message, the hint zk://,
// "permission denied".
func TestRedactsSecretsNotWords(t *testing.T) {
	t.Parallel()
	var none *fixture
	pgURL, err := pgx.ParseConfig(testenv.PG(t))
	if err != nil {
		t.Fatal(err)
	}
	host := pgURL.Host + ":" + strconv.Itoa(int(pgURL.Port))
	t.Run("UserName", func(t *testing.T) {
		u := "postgres://postgres@" + host + "/" + testenv.Name("nodb") + "?sslmode=disable"
		p := run(t, none.baseEnv(urlVar+"="+u, "LOCK_KEY=redact", "CRON_SCHEDULE=@hourly"), urlVar, "true")
		expectCode(t, p, exitFailure)
		if strings.Contains(p.stderr.String(), "xxxxx") || !strings.Contains(p.stderr.String(), "postgres") {
			t.Fatalf("a user name or word redacted: %s", p.output())
		}
	})
	t.Run("Password", func(t *testing.T) {
		u := "postgres://postgres:" + sentinel + "@" + host + "/" + testenv.Name("nodb") + "?sslmode=disable"
		p := run(t, none.baseEnv(urlVar+"="+u, "LOCK_KEY=redact", "CRON_SCHEDULE=@hourly"), urlVar, "true")
		expectCode(t, p, exitFailure)
		noSentinel(t, p)
	})
	t.Run("SchemeHint", func(t *testing.T) {
		p := run(t, none.baseEnv(urlVar+"=zk://", "LOCK_KEY=redact", "CRON_SCHEDULE=@hourly"), urlVar, "true")
		expectCode(t, p, exitUsage)
		if !strings.Contains(p.stderr.String(), "zk://host:port") {
			t.Fatalf("the hint is redacted: %s", p.output())
		}
	})
	t.Run("PermissionDenied", func(t *testing.T) {
		u := "redis://user:" + sentinel + "@127.0.0.1:1/0"
		p := run(t, none.baseEnv(urlVar+"="+u, "LOCK_KEY=redact", "CRON_SCHEDULE=@hourly"), urlVar, "/etc/passwd")
		expectCode(t, p, exitFailure)
		if !strings.Contains(p.stderr.String(), "/etc/passwd") || !strings.Contains(p.stderr.String(), "permission denied") {
			t.Fatalf("words redacted: %s", p.output())
		}
		noSentinel(t, p)
	})
}

// A process that leaves the command's group (setsid) is found (dislock is
// its subreaper) and ended before the locks are released.
func TestSetsidDescendantEnded(t *testing.T) {
	t.Parallel()
	f := redisFixture(t)
	pidFile := filepath.Join(t.TempDir(), "pid")
	env := f.baseEnv("LOCK_KEY="+f.newKey(t), "LOCK_STRATEGY=lease", "DISLOCK_GRACE_SECONDS=1")
	p := run(t, env, urlVar, "sh", "-c", "setsid sleep 300 >/dev/null 2>&1 </dev/null & echo $! > "+pidFile)
	expectCode(t, p, 0)
	if pid := readPIDs(t, pidFile)[0]; !processGone(pid) {
		t.Fatalf("the setsid'ed process %d runs on after dislock exited: %s", pid, p.output())
	}
}

// When the store refuses the lease with no grace left (DISLOCK_GRACE_SECONDS=0),
// SIGKILL follows SIGTERM at once without a word about a grace period.
func TestNoGraceMessageWithoutGrace(t *testing.T) {
	t.Parallel()
	f := redisFixture(t)
	key := f.newKey(t)
	started := filepath.Join(t.TempDir(), "started")
	env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease", "RUN_LOCK_TTL_SECONDS=10", "LOCK_LEASE_INTERVAL=0.2", "DISLOCK_GRACE_SECONDS=0")
	p := start(t, env, urlVar, "sh", "-c", `trap "" TERM; echo go > `+started+`; while :; do sleep 0.05; done`)
	waitFile(t, started, 20*time.Second)
	f.steal(t, leasePrefix+key)
	if code := p.wait(t, 20*time.Second); code != exitLeaseLost {
		t.Fatalf("exit %d: %s", code, p.output())
	}
	if strings.Contains(p.stderr.String(), "outlived the grace period") {
		t.Fatalf("a grace period that was never given: %s", p.output())
	}
}

// The CLI installs with one go install: its go.mod has no replace
// directives (go.work joins the modules of a clone) and does not require
// the test-only etcdtest module.
func TestInstallable(t *testing.T) {
	for _, line := range strings.Split(testenv.ReadFile(t, "go.mod"), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "replace") || strings.Contains(line, "etcdlock/etcdtest") {
			t.Errorf("go.mod: %q stops go install github.com/dislock/dislock/cmd/dislock@VERSION", line)
		}
	}
	if !exists("go.work") {
		t.Errorf("no go.work: a clone cannot build the CLI against its own modules")
	}
}
