package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dislock/dislock/internal/redistest"
	"github.com/dislock/dislock/internal/testenv"
)

// A schedule slot belongs to a run that started its command: a command
// that cannot be found or started, and a run that finds the lease held
// (schedule,lease), leave the slot to the next run of the same slot, which
// runs and whose log names only runs that started.
func TestSlotForRunsThatStarted(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		dir := t.TempDir()
		bad := filepath.Join(dir, "bad-interpreter")
		if err := os.WriteFile(bad, []byte("#!/nonexistent/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name string
			cmd  []string
		}{
			{"MissingCommand", []string{"/nonexistent/command"}},
			{"NotStartable", []string{bad}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				env := f.baseEnv("LOCK_KEY="+f.newKey(t), "CRON_SCHEDULE=@daily", "CRONJOB_LOCK_LOG_LEVEL=INFO")
				expectCode(t, run(t, env, append([]string{urlVar}, tc.cmd...)...), exitFailure)
				marker := filepath.Join(t.TempDir(), "ran")
				p := run(t, env, urlVar, "touch", marker)
				expectCode(t, p, 0)
				if !exists(marker) {
					t.Fatalf("the slot was used up by a run whose command did not start:\n%s", p.output())
				}
			})
		}
		t.Run("LeaseHeld", func(t *testing.T) {
			key := f.newKey(t)
			holder := startHolding(t, f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease"), "exec sleep 300")
			env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=schedule,lease", "CRON_SCHEDULE=@daily", "CRONJOB_LOCK_LOG_LEVEL=INFO")
			marker := filepath.Join(t.TempDir(), "ran")
			skipped := run(t, env, urlVar, "touch", marker)
			expectCode(t, skipped, 0)
			if exists(marker) {
				t.Fatalf("ran while the lease was held: %s", skipped.output())
			}
			holder.cmd.Process.Signal(os.Interrupt)
			holder.wait(t, 20*time.Second)
			p := run(t, env, urlVar, "touch", marker)
			expectCode(t, p, 0)
			if !exists(marker) {
				t.Fatalf("the slot was used up by a run that found the lease held:\n%s", p.output())
			}
		})
	})
}

// A schedule that never fires is refused before anything is created, with
// an error naming CRON_SCHEDULE.
func TestScheduleNeverFires(t *testing.T) {
	u := testenv.PG(t)
	table := testenv.Name("dislock_never_")
	conn := pgConn(t, u)
	dropAtCleanup(t, conn, table)
	var f *fixture
	env := f.baseEnv(urlVar+"="+u, "LOCK_KEY=never", "CRON_SCHEDULE=0 0 30 2 *", "LOCK_TABLE="+table, "DISLOCK_CREATE_TABLE=1")
	p := run(t, env, urlVar, "true")
	expectCode(t, p, exitUsage)
	if !strings.Contains(p.stderr.String(), "CRON_SCHEDULE") || strings.Contains(p.stderr.String(), "ForSlot") {
		t.Fatalf("the error does not name CRON_SCHEDULE: %s", p.output())
	}
	var exists bool
	if err := conn.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatalf("the table %s was created for a schedule that never fires", table)
	}
}

// A lease taken from outside while the command runs, with no renewal in
// between to notice (TTL 60s: renewals every 10s), is found at the
// release: dislock logs it at WARNING, naming the key and the holder the
// store has now. The command's exit code passes through.
func TestLeaseGoneAtRelease(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		proceed := filepath.Join(t.TempDir(), "proceed")
		key := f.newKey(t)
		env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease", "RUN_LOCK_TTL_SECONDS=60")
		p := startHolding(t, env, "while [ ! -e "+proceed+" ]; do sleep 0.02; done")
		f.steal(t, leasePrefix+key)
		if err := os.WriteFile(proceed, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if code := p.wait(t, 20*time.Second); code != 0 {
			t.Fatalf("exit %d, want the command's 0: %s", code, p.output())
		}
		var line string
		for _, l := range strings.Split(p.stderr.String(), "\n") {
			if strings.Contains(l, "lease lost") {
				line = l
			}
		}
		if !strings.Contains(line, "level=WARN") || !strings.Contains(line, leasePrefix+key) || !strings.Contains(line, "holder=thief") {
			t.Errorf("the loss found at release is not logged at WARNING with the key and the holder: %q\n%s", line, p.stderr.String())
		}
		if strings.Contains(p.stderr.String(), "release failed") {
			t.Errorf("the loss is logged as a failed release:\n%s", p.stderr.String())
		}
	})
}

// --wait / LOCK_WAIT_SECONDS, like flock -w: a run waits for a held lease,
// in the store's queue, and runs when the holder ends; a wait that runs out
// takes the busy path; without the lease strategy it is exit 2.
func TestWait(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		key := f.newKey(t)
		dir := t.TempDir()
		release := filepath.Join(dir, "release")
		env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease", "DISLOCK_BUSY_EXIT_CODE=9")
		holder := startHolding(t, env, "while [ ! -e "+release+" ]; do sleep 0.05; done")

		// Runs out: the busy path, after the wait.
		short := run(t, env, "--wait", "1s", urlVar, "true")
		expectCode(t, short, 9)
		if took := short.ended.Sub(short.started); took < time.Second {
			t.Fatalf("a 1s wait gave up after %v", took)
		}

		marker := filepath.Join(dir, "ran")
		waiter := start(t, append(env, "LOCK_WAIT_SECONDS=30", "CRONJOB_LOCK_LOG_LEVEL=DEBUG"), urlVar, "touch", marker)
		if !testenv.WaitFor(20*time.Second, func() bool { return strings.Contains(waiter.stderr.String(), "waiting for the lock") }) {
			t.Fatalf("the waiter did not start waiting: %s", waiter.output())
		}
		if exists(marker) {
			t.Fatalf("the waiter ran while the lease was held: %s", waiter.output())
		}
		os.WriteFile(release, []byte("x\n"), 0o644)
		if code := holder.wait(t, 20*time.Second); code != 0 {
			t.Fatalf("holder exit %d: %s", code, holder.output())
		}
		if code := waiter.wait(t, 30*time.Second); code != 0 || !exists(marker) {
			t.Fatalf("the waiter did not run after the holder ended (exit %d): %s", code, waiter.output())
		}

		bad := run(t, f.baseEnv("LOCK_KEY="+key, "CRON_SCHEDULE=@hourly", "LOCK_WAIT_SECONDS=5"), urlVar, "true")
		expectCode(t, bad, exitUsage)
		if !strings.Contains(bad.stderr.String(), "LOCK_WAIT_SECONDS (--wait)") {
			t.Fatalf("the error does not name LOCK_WAIT_SECONDS: %s", bad.output())
		}
	})
}

// Runs that wait get the lease in the order they began to wait (the
// store's queue): with two waiters in line, the first in line runs first.
func TestWaitInLine(t *testing.T) {
	t.Parallel()
	f := redisFixture(t)
	opt, err := redis.ParseURL(f.url)
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(opt)
	defer client.Close()
	key := f.newKey(t)
	queue := redistest.LockKey("dislock", leasePrefix+key) + ":q"
	inLine := func(n int64) {
		t.Helper()
		if !testenv.WaitFor(20*time.Second, func() bool {
			got, _ := client.ZCard(context.Background(), queue).Result()
			return got >= n
		}) {
			t.Fatalf("fewer than %d waiters in line", n)
		}
	}
	dir := t.TempDir()
	release, order := filepath.Join(dir, "release"), filepath.Join(dir, "order")
	env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease")
	holder := startHolding(t, env, "while [ ! -e "+release+" ]; do sleep 0.05; done")
	first := start(t, env, "--wait", "30s", urlVar, "sh", "-c", "echo first >> "+order)
	inLine(1)
	second := start(t, env, "--wait", "30s", urlVar, "sh", "-c", "echo second >> "+order)
	inLine(2)
	os.WriteFile(release, []byte("x\n"), 0o644)
	for _, p := range []*proc{holder, first, second} {
		if code := p.wait(t, 30*time.Second); code != 0 {
			t.Fatalf("exit %d: %s", code, p.output())
		}
	}
	if b, _ := os.ReadFile(order); string(b) != "first\nsecond\n" {
		t.Fatalf("the waiters ran in the order %q, want first then second", b)
	}
}
