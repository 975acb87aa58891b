package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
	"github.com/dislock/dislock/internal/testenv"
)

// limitInv is the invocation of a lease run of key under LOCK_LIMIT=n.
func limitInv(t *testing.T, key string, n int) *invocation {
	t.Helper()
	inv, err := parseArgs([]string{"U", "true"}, envOf("U", testURL, "LOCK_KEY", key, "LOCK_STRATEGY", "lease",
		"LOCK_LIMIT", strconv.Itoa(n)))
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

// On a backend without semaphores, LOCK_LIMIT above 1 is a configuration
// error (exit 2) naming LOCK_LIMIT and the backend, and nothing is taken.
func TestLimitNeedsSemaphores(t *testing.T) {
	store := memlock.NewStore()
	l, err := core.New(testenv.MutexOnly{Backend: store.Backend()})
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	c := newCLI(&bytes.Buffer{}, &stderr, envOf())
	inv := limitInv(t, "job", 3)
	closed := false
	_, _, _, err = c.take(context.Background(), inv, l, func() error { closed = true; return l.Close() })
	if code := c.exitCode(err); code != exitUsage {
		t.Fatalf("exit %d, want %d: %v", code, exitUsage, err)
	}
	if msg := err.Error(); !strings.Contains(msg, "LOCK_LIMIT") || !strings.Contains(msg, "semaphores") || !strings.Contains(msg, "memory") {
		t.Errorf("error %q does not name LOCK_LIMIT, semaphores and the backend", msg)
	}
	if !closed {
		t.Error("the backend was not closed")
	}
	if store.Held(inv.run.leaseKey()) {
		t.Error("the lease is held after the error")
	}
}

// On a backend with semaphores (memlock here; the process tests use the
// real servers), LOCK_LIMIT=3 lets three runs take the lease, each with its
// own token; the fourth is busy; a run without LOCK_LIMIT is exit 2
// naming LOCK_LIMIT.
func TestLimitTake(t *testing.T) {
	store := memlock.NewStore()
	var sessions []core.Session
	tokens := map[uint64]bool{}
	take := func(inv *invocation) error {
		l, err := store.Locker()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		c := newCLI(&bytes.Buffer{}, &bytes.Buffer{}, envOf())
		_, lease, _, err := c.take(context.Background(), inv, l, l.Close)
		if err == nil {
			sessions = append(sessions, lease)
			tokens[lease.Token()] = true
		}
		return err
	}
	for i := range 3 {
		if err := take(limitInv(t, "job", 3)); err != nil {
			t.Fatalf("run %d under LOCK_LIMIT=3: %v", i, err)
		}
	}
	if len(tokens) != 3 {
		t.Errorf("tokens %v, want three distinct ones", tokens)
	}
	err := take(limitInv(t, "job", 3))
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 0 || ee.err != nil {
		t.Errorf("fourth run: %v, want the busy exit (0, nothing to log)", err)
	}
	err = take(limitInv(t, "job", 1))
	if code := newCLI(&bytes.Buffer{}, &bytes.Buffer{}, envOf()).exitCode(err); code != exitUsage || !strings.Contains(err.Error(), "LOCK_LIMIT") {
		t.Errorf("run without LOCK_LIMIT: exit %d, %v; want 2 naming LOCK_LIMIT", code, err)
	}
	for _, s := range sessions {
		s.Release(context.Background())
	}
}

// table is the fixture's LOCK_TABLE, if any.
func (f *fixture) table() string {
	for _, kv := range f.env {
		if v, ok := strings.CutPrefix(kv, "LOCK_TABLE="); ok {
			return v
		}
	}
	return ""
}

// semaphores reports whether the fixture's backend holds semaphores, as
// the CLI opens it.
func (f *fixture) semaphores(t *testing.T) bool {
	t.Helper()
	table := f.table()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, closeFn, err := openLocker(ctx, urlVar, f.url, table, tableAdmin, false, 5*time.Second, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("open the %s backend: %v", f.name, err)
	}
	defer closeFn()
	return hasSemaphores(l)
}

// LOCK_LIMIT=2 against the real servers: two instances of a key run at
// once, each with its own DISLOCK_TOKEN; a third does not start (exit 0, or
// the busy exit code); a run without LOCK_LIMIT is exit 2 naming it;
// status and list show both permits; when one ends, another run starts;
// release --force frees every permit. On a backend without semaphores,
// LOCK_LIMIT=2 is exit 2 naming LOCK_LIMIT, and the command does not run.
func TestLimitProcess(t *testing.T) {
	forEachBackend(t, limitProcess)
}

// limitProcess is TestLimitProcess on f; TestEtcd and TestZK run it too.
func limitProcess(t *testing.T, f *fixture) {
	dir := t.TempDir()
	key := f.newKey(t)
	lockKey := leasePrefix + key
	base := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease", "RUN_LOCK_TTL_SECONDS=10", "LOCK_LEASE_INTERVAL=0.3", "DISLOCK_GRACE_SECONDS=1")
	// DISLOCK_CREATE_TABLE lets the runs create what a semaphore needs
	// beside the test's PostgreSQL table (dropped at the end).
	env := append(append([]string{}, base...), "LOCK_LIMIT=2", "DISLOCK_CREATE_TABLE=1")
	if table := f.table(); table != "" && f.name == "pg" {
		dropAtCleanup(t, pgConn(t, f.url), table+"_permits")
	}
	marker := filepath.Join(dir, "ran")
	admin := f.baseEnv()
	if !f.semaphores(t) {
		p := run(t, env, urlVar, "touch", marker)
		if p.code != exitUsage || !strings.Contains(p.stderr.String(), "LOCK_LIMIT") || !strings.Contains(p.stderr.String(), "semaphores") {
			t.Fatalf("LOCK_LIMIT=2 on %s without semaphores: exit %d, want 2 naming LOCK_LIMIT:\n%s", f.name, p.code, p.output())
		}
		if exists(marker) {
			t.Fatal("the command ran")
		}
		st := run(t, admin, "status", "--url-env", urlVar, lockKey)
		if !strings.Contains(st.stdout.String(), "free") {
			t.Fatalf("status after the refused run: %s", st.output())
		}
		return
	}
	var holders []*proc
	for i := range 2 {
		started, stop := filepath.Join(dir, fmt.Sprint("started", i)), filepath.Join(dir, fmt.Sprint("stop", i))
		holders = append(holders, start(t, env, urlVar, "sh", "-c",
			fmt.Sprintf(`echo "$DISLOCK_TOKEN" > %s; while [ ! -e %s ]; do sleep 0.05; done`, started, stop)))
	}
	tokens := map[string]bool{}
	for i, h := range holders {
		path := filepath.Join(dir, fmt.Sprint("started", i))
		deadline := time.Now().Add(20 * time.Second)
		for !exists(path) {
			select {
			case <-h.done:
				t.Fatalf("instance %d exited %d before its command started:\n%s", i, h.code, h.output())
			case <-time.After(20 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("instance %d did not start its command within 20s:\n%s", i, h.output())
			}
		}
		tokens[waitFile(t, path, 20*time.Second)] = true
	}
	if len(tokens) != 2 {
		t.Errorf("DISLOCK_TOKEN of the two instances: %v, want two distinct tokens", tokens)
	}

	expectCode(t, run(t, env, urlVar, "touch", marker), 0)
	expectCode(t, run(t, env, "--busy-exit-code", "9", urlVar, "touch", marker), 9)
	p := run(t, base, urlVar, "touch", marker)
	if p.code != exitUsage || !strings.Contains(p.stderr.String(), "LOCK_LIMIT") {
		t.Errorf("a run without LOCK_LIMIT while two hold the key under 2: exit %d, want 2 naming LOCK_LIMIT:\n%s", p.code, p.output())
	}
	if exists(marker) {
		t.Fatal("a third instance's command ran")
	}

	st := run(t, admin, "status", "--url-env", urlVar, lockKey)
	expectCode(t, st, 0)
	if n := strings.Count(st.stdout.String(), "\theld\t"); n != 2 || strings.Count(st.stdout.String(), "limit=2") != 2 {
		t.Errorf("status shows %d holders, want 2 lines ending in limit=2:\n%s", n, st.output())
	}
	ls := run(t, admin, "list", "--url-env", urlVar, lockKey)
	expectCode(t, ls, 0)
	if n := strings.Count(ls.stdout.String(), lockKey+"\theld\t"); n != 2 {
		t.Errorf("list shows %d permits of the key, want 2:\n%s", n, ls.output())
	}

	os.WriteFile(filepath.Join(dir, "stop0"), nil, 0o600)
	if code := holders[0].wait(t, 20*time.Second); code != 0 {
		t.Fatalf("first instance: exit %d: %s", code, holders[0].output())
	}
	expectCode(t, run(t, env, urlVar, "touch", marker), 0)
	if !exists(marker) {
		t.Fatal("a run did not start after one of the two instances ended")
	}

	rel := run(t, admin, "release", "--url-env", urlVar, lockKey, "--force")
	expectCode(t, rel, 0)
	if code := holders[1].wait(t, 20*time.Second); code != exitLeaseLost {
		t.Fatalf("second instance after release --force: exit %d, want %d: %s", code, exitLeaseLost, holders[1].output())
	}
	st = run(t, admin, "status", "--url-env", urlVar, lockKey)
	if !strings.Contains(st.stdout.String(), "free") {
		t.Fatalf("status after release --force: %s", st.output())
	}
}

// status prints a line per permit of a semaphore, each ending in limit=N,
// and the one line of a mutex as before.
func TestStatusPermits(t *testing.T) {
	l, err := memlock.New()
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	for range 2 {
		defer testenv.Hold(t, ctx, l, "sem", core.Limit(3)).Release(ctx)
	}
	defer testenv.Hold(t, ctx, l, "mutex").Release(ctx)
	var out bytes.Buffer
	c := newCLI(&out, &bytes.Buffer{}, envOf())
	for _, key := range []string{"sem", "mutex", "free"} {
		if err := c.printStatus(ctx, l, key); err != nil && (key != "free" || c.exitCode(err) != exitFree) {
			t.Fatal(err)
		}
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("status printed %d lines, want 2 permits, 1 mutex, 1 free:\n%s", len(lines), out.String())
	}
	for _, line := range lines[:2] {
		if !strings.HasPrefix(line, "sem\theld\t") || !strings.HasSuffix(line, "\tlimit=3") {
			t.Errorf("permit line %q", line)
		}
	}
	if lines[0] == lines[1] {
		t.Errorf("the two permits print the same line %q", lines[0])
	}
	if !strings.HasPrefix(lines[2], "mutex\theld\t") || strings.Contains(lines[2], "limit=") {
		t.Errorf("mutex line %q", lines[2])
	}
	if lines[3] != "free\tfree" {
		t.Errorf("free line %q", lines[3])
	}
}
