package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// --wait / LOCK_WAIT_SECONDS, like flock -w: a run waits for a held lease,
// in the store's queue, and runs when the holder ends; a wait that runs out
// takes the busy path; without the lease strategy it is exit 2.
func TestWait(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		key := f.newKey(t)
		dir := t.TempDir()
		started, release := filepath.Join(dir, "started"), filepath.Join(dir, "release")
		env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease", "DISLOCK_BUSY_EXIT_CODE=9")
		holder := start(t, env, urlVar, "sh", "-c", "echo go > "+started+"; while [ ! -e "+release+" ]; do sleep 0.05; done")
		waitFile(t, started, 20*time.Second)

		// Runs out: the busy path, after the wait.
		short := run(t, env, "--wait", "1s", urlVar, "true")
		expectCode(t, short, 9)
		if took := short.ended.Sub(short.started); took < time.Second {
			t.Fatalf("a 1s wait gave up after %v", took)
		}

		marker := filepath.Join(dir, "ran")
		waiter := start(t, append(env, "LOCK_WAIT_SECONDS=30", "CRONJOB_LOCK_LOG_LEVEL=DEBUG"), urlVar, "touch", marker)
		for deadline := time.Now().Add(20 * time.Second); !strings.Contains(waiter.stderr.String(), "waiting for the lock"); {
			if time.Now().After(deadline) {
				t.Fatalf("the waiter did not start waiting: %s", waiter.output())
			}
			time.Sleep(20 * time.Millisecond)
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
	queue := "dislock:{" + leasePrefix + key + "}:q"
	inLine := func(n int64) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if got, _ := client.ZCard(context.Background(), queue).Result(); got >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("fewer than %d waiters in line", n)
			}
		}
	}
	dir := t.TempDir()
	started, release, order := filepath.Join(dir, "started"), filepath.Join(dir, "release"), filepath.Join(dir, "order")
	env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease")
	holder := start(t, env, urlVar, "sh", "-c", "echo go > "+started+"; while [ ! -e "+release+" ]; do sleep 0.05; done")
	waitFile(t, started, 20*time.Second)
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
