package main

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dislock/dislock/internal/redistest"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/pg"
)

// binary is the dislock executable built by TestMain.
var binary string

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "dislock-cli-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binary = filepath.Join(dir, "dislock")
	build := exec.Command("go", "build", "-o", binary, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build dislock:", err)
		return 1
	}
	if code := m.Run(); code != 0 {
		return code
	}
	// The tests' own goroutines (process waiters, proxies) must be gone; an
	// embedded etcd server's peer connections (net/http, owned by etcd's
	// rafthttp) may still be winding down.
	if err := goleak.Find(
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
		goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
	); err != nil {
		fmt.Fprintln(os.Stderr, "goleak:", err)
		return 1
	}
	return 0
}

// sentinel is a password that must never appear in any output.
const sentinel = "Sentinel7Pw9Zq"

// urlVar is the environment variable the tests put the backend URL in.
const urlVar = "DISLOCK_TEST_LOCK_URL"

// fixture is one backend the CLI runs against.
type fixture struct {
	name string
	url  string
	env  []string // extra settings (LOCK_TABLE)
	// steal makes the lock key belong to someone else, as another process
	// that broke it would.
	steal func(t *testing.T, key string)
	// forget, when set, deletes a lock key at the end of the test.
	forget func(key string)
	// held reports whether the server still holds key (not expired).
	held func(t *testing.T, key string) bool
}

// forEachBackend runs fn against PostgreSQL, MySQL and Redis, each with its
// own table or keys. A missing server skips the subtest (fails under CI).
func forEachBackend(t *testing.T, fn func(t *testing.T, f *fixture)) {
	t.Run("pg", func(t *testing.T) { fn(t, pgFixture(t)) })
	t.Run("mysql", func(t *testing.T) { fn(t, mysqlFixture(t)) })
	t.Run("redis", func(t *testing.T) { fn(t, redisFixture(t)) })
}

func pgFixture(t *testing.T) *fixture {
	u := testenv.PG(t)
	table := testenv.Name("dislock_cli_")
	ctx := context.Background()
	conn := pgConn(t, u)
	dropAtCleanup(t, conn, table)
	// A table named by LOCK_TABLE must exist: the CLI creates only the
	// default one.
	ddl, err := pg.SchemaSQL(table, false, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, ddl); err != nil {
		t.Fatalf("create %s: %v", table, err)
	}
	return &fixture{
		name: "pg", url: u, env: []string{"LOCK_TABLE=" + table},
		held: func(t *testing.T, key string) bool {
			var held bool
			err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+pgx.Identifier{table}.Sanitize()+" WHERE key = $1 AND expire_at > now())", key).Scan(&held)
			if err != nil {
				t.Fatal(err)
			}
			return held
		},
		steal: func(t *testing.T, key string) {
			tag, err := conn.Exec(ctx, "UPDATE "+pgx.Identifier{table}.Sanitize()+" SET holder = 'thief', owner = 'thief' WHERE key = $1", key)
			if err != nil || tag.RowsAffected() != 1 {
				t.Fatalf("steal %s: %v (%d rows)", key, err, tag.RowsAffected())
			}
		},
	}
}

// pgConn is a connection to PostgreSQL at u for the test's own set-up and
// checks; it is closed when the test ends.
func pgConn(t *testing.T, u string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), u)
	if err != nil {
		t.Fatalf("connect to PostgreSQL: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// dropAtCleanup drops table, if it exists, on conn (of pgConn) when the
// test ends.
func dropAtCleanup(t *testing.T, conn *pgx.Conn, table string) {
	t.Cleanup(func() {
		if _, err := conn.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize()); err != nil {
			t.Errorf("drop %s: %v", table, err)
		}
	})
}

func redisFixture(t *testing.T) *fixture {
	u := testenv.Redis(t)
	opt, err := redis.ParseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(opt)
	var mu sync.Mutex
	var keys []string
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, k := range keys {
			lock := redistest.LockKey("dislock", k)
			client.Del(context.Background(), lock, lock+":q", lock+":qd")
		}
		client.Close()
	})
	return &fixture{
		name: "redis", url: u,
		held: func(t *testing.T, key string) bool {
			// A held lock's record has five fields; a released one's
			// tombstone two (redislock's documented layout).
			v, err := client.Get(context.Background(), redistest.LockKey("dislock", key)).Result()
			if err == redis.Nil {
				return false
			}
			if err != nil {
				t.Fatal(err)
			}
			return strings.Count(v, "|") >= 4
		},
		forget: func(key string) {
			mu.Lock()
			keys = append(keys, key)
			mu.Unlock()
		},
		steal: func(t *testing.T, key string) {
			if held, err := redistest.Steal(context.Background(), client, "dislock", key); err != nil || !held {
				t.Fatalf("steal %s: %v (held: %v)", key, err, held)
			}
		},
	}
}

// newKey returns a unique LOCK_KEY whose locks are deleted after the test.
func (f *fixture) newKey(t *testing.T) string {
	key := testenv.Name("clitest-")
	if f.forget != nil {
		f.forget(schedulePrefix + key)
		f.forget(leasePrefix + key)
	}
	return key
}

// baseEnv is the test process's environment without any dislock setting,
// plus the backend URL and the fixture's settings.
func (f *fixture) baseEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(name, "LOCK_"), strings.HasPrefix(name, "DISLOCK_"), name == "CRON_SCHEDULE",
			name == "RUN_LOCK_TTL_SECONDS", name == "CRONJOB_LOCK_LOG_LEVEL", name == "DATABASE_URL":
			continue
		}
		env = append(env, kv)
	}
	if f != nil {
		env = append(env, urlVar+"="+f.url)
		env = append(env, f.env...)
	}
	return append(env, extra...)
}

// proc is a running dislock.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr testenv.SyncBuffer
	done           chan struct{}
	code           int
	started        time.Time
	ended          time.Time
}

func start(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{done: make(chan struct{})}
	p.cmd = exec.Command(binary, args...)
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	startProc(t, p)
	return p
}

// startHolding starts dislock with env (it takes the lock of urlVar's
// store) running the shell script, and waits until the command runs: the
// lock is held then.
func startHolding(t *testing.T, env []string, script string) *proc {
	t.Helper()
	started := filepath.Join(t.TempDir(), "started")
	p := start(t, env, urlVar, "sh", "-c", "echo go > "+started+"; "+script)
	waitFile(t, started, 20*time.Second)
	return p
}

// startProc starts the process p.cmd describes and collects its exit.
func startProc(t *testing.T, p *proc) {
	t.Helper()
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.cmd.Wait()
		p.ended = time.Now()
		p.code = p.cmd.ProcessState.ExitCode()
		if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			p.code = 128 + int(ws.Signal())
		}
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
	})
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(timeout):
		p.cmd.Process.Kill()
		<-p.done
		t.Fatalf("dislock did not exit within %v\nstdout: %s\nstderr: %s", timeout, p.stdout.String(), p.stderr.String())
		return -1
	}
}

func (p *proc) output() string { return p.stdout.String() + p.stderr.String() }

// run runs dislock to completion.
func run(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := start(t, env, args...)
	p.wait(t, 60*time.Second)
	return p
}

func expectCode(t *testing.T, p *proc, want int) {
	t.Helper()
	if p.code != want {
		t.Fatalf("exit code %d, want %d\nstdout: %s\nstderr: %s", p.code, want, p.stdout.String(), p.stderr.String())
	}
}

// waitFile waits until path exists and returns its content.
func waitFile(t *testing.T, path string, timeout time.Duration) string {
	t.Helper()
	var content string
	if !testenv.WaitFor(timeout, func() bool {
		b, err := os.ReadFile(path)
		content = string(b)
		return err == nil && len(b) > 0 && bytes.HasSuffix(b, []byte("\n"))
	}) {
		t.Fatalf("%s did not appear within %v", path, timeout)
	}
	return strings.TrimSpace(content)
}

// readPIDs reads the process IDs a command wrote to path (waitFile); the
// processes still running are killed when the test ends.
func readPIDs(t *testing.T, path string) []int {
	t.Helper()
	var pids []int
	for _, s := range strings.Fields(waitFile(t, path, 20*time.Second)) {
		pid, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("pid file %s: %v", path, err)
		}
		pids = append(pids, pid)
	}
	t.Cleanup(func() {
		for _, pid := range pids {
			if !processGone(pid) {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	return pids
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// processGone reports whether pid has exited (or is a zombie awaiting its
// reaper).
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] == 'Z'
	}
	return false
}

func waitGone(t *testing.T, pid int, timeout time.Duration) {
	t.Helper()
	if !testenv.WaitFor(timeout, func() bool { return processGone(pid) }) {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("process %d still alive after %v", pid, timeout)
	}
}

// waitExec waits until process pid runs the program name (its exec is
// done), where /proc tells; elsewhere it returns at once.
func waitExec(t *testing.T, pid int, name string, timeout time.Duration) {
	t.Helper()
	if _, err := os.Stat("/proc/self/comm"); err != nil {
		return // no /proc here
	}
	if !testenv.WaitFor(timeout, func() bool {
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil && processGone(pid) {
			t.Fatalf("process %d is gone before it ran %s", pid, name)
		}
		return err == nil && strings.TrimSpace(string(comm)) == name
	}) {
		t.Fatalf("process %d did not run %s within %v", pid, name, timeout)
	}
}

func noSentinel(t *testing.T, p *proc) {
	t.Helper()
	if out := p.output(); strings.Contains(out, sentinel) {
		t.Errorf("the password appears in the output:\n%s", out)
	}
}

// Exit codes: the command's own code passes through; 0 on success; 128+N
// for a command killed by signal N; 1 (runtime failure) for a missing command.
func TestExitCodes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		key := f.newKey(t)
		env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease")
		for _, tc := range []struct {
			cmd  []string
			want int
		}{
			{[]string{"true"}, 0},
			{[]string{"sh", "-c", "exit 3"}, 3},
			{[]string{"sh", "-c", "exit 42"}, 42},
			{[]string{"sh", "-c", "kill -TERM $$"}, 128 + 15},
			{[]string{"/nonexistent/command"}, 1},
		} {
			p := run(t, env, append([]string{urlVar}, tc.cmd...)...)
			expectCode(t, p, tc.want)
		}
	})
}

// An unreachable backend is a runtime failure (exit 1): the command does not
// start, and the password in the URL is not printed.
func TestUnreachable(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	for _, u := range []string{
		"postgres://user:" + sentinel + "@127.0.0.1:1/db?sslmode=disable&connect_timeout=5",
		"redis://user:" + sentinel + "@127.0.0.1:1/0",
	} {
		var f *fixture
		env := f.baseEnv(urlVar+"="+u, "LOCK_KEY=k", "CRON_SCHEDULE=@hourly", "CRONJOB_LOCK_LOG_LEVEL=DEBUG")
		p := run(t, env, urlVar, "touch", marker)
		expectCode(t, p, 1)
		noSentinel(t, p)
		if exists(marker) {
			t.Fatalf("%s: the command ran", scheme(u))
		}
		if !strings.Contains(p.stderr.String(), urlVar) {
			t.Errorf("the error does not say which setting holds the URL: %s", p.stderr.String())
		}
	}
}

// Busy: a second dislock on the same key while the first runs exits 0 (or
// the busy exit code) and its command never starts.
func TestBusy(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		for _, strategy := range []string{"lease", "schedule", "schedule,lease"} {
			t.Run(strings.ReplaceAll(strategy, ",", "+"), func(t *testing.T) {
				dir := t.TempDir()
				started, stop, second := filepath.Join(dir, "started"), filepath.Join(dir, "stop"), filepath.Join(dir, "second")
				env := f.baseEnv("LOCK_KEY="+f.newKey(t), "LOCK_STRATEGY="+strategy, "CRON_SCHEDULE=@hourly")
				first := start(t, env, urlVar, "sh", "-c", fmt.Sprintf("echo $$ > %s; while [ ! -e %s ]; do sleep 0.05; done", started, stop))
				waitFile(t, started, 20*time.Second)

				p := run(t, env, urlVar, "touch", second)
				expectCode(t, p, 0)
				if exists(second) {
					t.Fatal("the second instance's command ran")
				}
				p = run(t, env, "--busy-exit-code", "9", urlVar, "touch", second)
				expectCode(t, p, 9)
				p = run(t, append(env, "DISLOCK_BUSY_EXIT_CODE=8"), urlVar, "touch", second)
				expectCode(t, p, 8)
				if exists(second) {
					t.Fatal("the second instance's command ran")
				}
				os.WriteFile(stop, nil, 0o600)
				if code := first.wait(t, 20*time.Second); code != 0 {
					t.Fatalf("first: exit %d: %s", code, first.output())
				}
			})
		}
	})
}

// Schedule: two starts in one slot run the command once; the next slot runs
// it again.
func TestScheduleSlots(t *testing.T) {
	const slot = 4 * time.Second
	forEachBackend(t, func(t *testing.T, f *fixture) {
		dir := t.TempDir()
		log := filepath.Join(dir, "runs")
		env := f.baseEnv("LOCK_KEY="+f.newKey(t), "CRON_SCHEDULE=@every 4s")
		cmd := []string{urlVar, "sh", "-c", "echo run >> " + log}
		runs := func() int {
			b, _ := os.ReadFile(log)
			return strings.Count(string(b), "run")
		}
		// Start just after a slot boundary: with the default 1s tolerance a
		// start belongs to the current slot until 1s before its end.
		sleepUntil := func(at time.Time) { time.Sleep(time.Until(at)) }
		sleepUntil(time.Now().Truncate(slot).Add(slot + 100*time.Millisecond))
		slotEnd := time.Now().Truncate(slot).Add(slot)

		expectCode(t, run(t, env, cmd...), 0)
		expectCode(t, run(t, env, cmd...), 0)
		if time.Now().After(slotEnd.Add(-time.Second)) {
			t.Skip("the machine is too slow for 4s slots")
		}
		if n := runs(); n != 1 {
			t.Fatalf("%d runs in one slot, want 1", n)
		}
		sleepUntil(slotEnd.Add(100 * time.Millisecond))
		expectCode(t, run(t, env, cmd...), 0)
		if n := runs(); n != 2 {
			t.Fatalf("%d runs after the next slot began, want 2", n)
		}
	})
}

// Lease loss: when the lock is taken from outside, the whole process group
// is terminated (the grandchild too) and dislock exits 75.
func TestLeaseLoss(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		dir := t.TempDir()
		pidFile := filepath.Join(dir, "pid")
		key := f.newKey(t)
		env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease", "RUN_LOCK_TTL_SECONDS=30", "LOCK_LEASE_INTERVAL=0.5")
		p := start(t, env, urlVar, "sh", "-c", "sleep 300 & echo $! > "+pidFile+"; wait")
		pid, err := strconv.Atoi(waitFile(t, pidFile, 20*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		f.steal(t, leasePrefix+key)
		if code := p.wait(t, 20*time.Second); code != exitLeaseLost {
			t.Fatalf("exit %d, want 75: %s", code, p.output())
		}
		waitGone(t, pid, 5*time.Second)
		if !strings.Contains(p.stderr.String(), "lease lost") {
			t.Errorf("the loss is not logged: %s", p.stderr.String())
		}
	})
}

// A command that ignores SIGTERM is killed after the grace period, or
// earlier when the lease would otherwise expire first.
func TestLeaseLossKill(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		for _, tc := range []struct {
			name       string
			ttl, grace string
			min, max   time.Duration
		}{
			// TTL 30s: the grace period (1s) decides.
			{"grace", "30", "1", 900 * time.Millisecond, 6 * time.Second},
			// Grace 60s but TTL 3s: killed before the lease could pass on
			// (renew deadline 2s + 3/4 of the 1s margin after the last renewal).
			{"ttl", "3", "60", 0, 5 * time.Second},
		} {
			t.Run(tc.name, func(t *testing.T) {
				dir := t.TempDir()
				pidFile := filepath.Join(dir, "pid")
				key := f.newKey(t)
				env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease", "RUN_LOCK_TTL_SECONDS="+tc.ttl,
					"LOCK_LEASE_INTERVAL=0.3", "DISLOCK_GRACE_SECONDS="+tc.grace)
				p := start(t, env, urlVar, "sh", "-c", `trap "" TERM; sleep 300 & echo $! > `+pidFile+`; while :; do wait; done`)
				pid, err := strconv.Atoi(waitFile(t, pidFile, 20*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				f.steal(t, leasePrefix+key)
				stolen := time.Now()
				if code := p.wait(t, 30*time.Second); code != exitLeaseLost {
					t.Fatalf("exit %d, want 75: %s", code, p.output())
				}
				took := p.ended.Sub(stolen)
				if took < tc.min || took > tc.max {
					t.Errorf("the group was killed %v after the steal, want %v…%v\n%s", took, tc.min, tc.max, p.stderr.String())
				}
				waitGone(t, pid, 5*time.Second)
				if !strings.Contains(p.stderr.String(), "SIGKILL") {
					t.Errorf("no SIGKILL logged: %s", p.stderr.String())
				}
			})
		}
	})
}

// Under LOCK_ON_LEASE_LOSS=continue the command keeps running after a loss
// and its own exit code is returned.
func TestLeaseLossContinue(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		stop := filepath.Join(t.TempDir(), "stop")
		key := f.newKey(t)
		env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease", "RUN_LOCK_TTL_SECONDS=3", "LOCK_LEASE_INTERVAL=0.3", "LOCK_ON_LEASE_LOSS=continue")
		p := startHolding(t, env, "while [ ! -e "+stop+" ]; do sleep 0.05; done; exit 4")
		f.steal(t, leasePrefix+key)
		if !testenv.WaitFor(10*time.Second, func() bool { return strings.Contains(p.stderr.String(), "lease lost") }) {
			t.Fatalf("no loss logged: %s", p.output())
		}
		os.WriteFile(stop, nil, 0o600)
		if code := p.wait(t, 20*time.Second); code != 4 {
			t.Fatalf("exit %d, want the command's 4: %s", code, p.output())
		}
	})
}

// Signals to dislock reach the command's group; the lock is released after
// the command exits.
func TestSignals(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP} {
			t.Run(sigName(sig), func(t *testing.T) {
				dir := t.TempDir()
				ready, got := filepath.Join(dir, "ready"), filepath.Join(dir, "got")
				key := f.newKey(t)
				env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease")
				name := sigName(sig)
				// The shell's trap records the signal, stops the sleep (which
				// ignores SIGINT, as background jobs of sh do), waits for it
				// and exits 5. (Without the wait the command exits while its
				// child may still be dying, which on a busy machine can take
				// longer than dislock lets a group outlive its leader before
				// it says so.)
				script := fmt.Sprintf(`trap 'echo %s > %s; kill $pid; wait $pid; exit 5' %s; sleep 300 & pid=$!; echo $pid > %s; wait; exit 9`, name, got, name, ready)
				p := start(t, env, urlVar, "sh", "-c", script)
				pid, err := strconv.Atoi(waitFile(t, ready, 20*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				// The shell writes the pid once it has forked the sleep,
				// which may not have exec'd yet: a signal before the exec
				// would reach the shell's trap handler in the child, and
				// the sleep would run on.
				waitExec(t, pid, "sleep", 20*time.Second)
				p.cmd.Process.Signal(sig)
				if code := p.wait(t, 20*time.Second); code != 5 {
					t.Fatalf("exit %d, want the command's 5: %s", code, p.output())
				}
				if waitFile(t, got, time.Second) != name {
					t.Fatalf("the command did not get %s", name)
				}
				waitGone(t, pid, 5*time.Second)
				if strings.Contains(p.stderr.String(), "still running") {
					t.Errorf("the group outlived the command: %s", p.stderr.String())
				}
				st := run(t, f.baseEnv(), "status", "--url-env", urlVar, leasePrefix+key)
				expectCode(t, st, exitFree)
				if !strings.Contains(st.stdout.String(), "free") {
					t.Fatalf("lock not released: %s", st.output())
				}
			})
		}
	})
}

func sigName(s syscall.Signal) string {
	switch s {
	case syscall.SIGTERM:
		return "TERM"
	case syscall.SIGINT:
		return "INT"
	case syscall.SIGHUP:
		return "HUP"
	}
	return s.String()
}

// The command's environment has DISLOCK_KEY, DISLOCK_TOKEN and
// DISLOCK_DEADLINE; the schedule,lease strategy (in any order) holds both
// locks while the command runs.
func TestChildEnvAndBothLocks(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		for _, strategy := range []string{"schedule,lease", "lease, schedule"} {
			key := f.newKey(t)
			env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY="+strategy, "CRON_SCHEDULE=@hourly")
			status := fmt.Sprintf(`"%s" status --url-env %s %s%s; "%s" status --url-env %s %s%s`,
				binary, urlVar, schedulePrefix, key, binary, urlVar, leasePrefix, key)
			p := run(t, env, urlVar, "sh", "-c", `echo "$DISLOCK_KEY|$DISLOCK_TOKEN|$DISLOCK_DEADLINE"; `+status)
			expectCode(t, p, 0)
			lines := strings.Split(strings.TrimSpace(p.stdout.String()), "\n")
			if len(lines) != 3 {
				t.Fatalf("output: %q", p.output())
			}
			parts := strings.Split(lines[0], "|")
			if len(parts) != 3 || parts[0] != leasePrefix+key {
				t.Fatalf("environment: %q", lines[0])
			}
			if tok, err := strconv.ParseUint(parts[1], 10, 64); err != nil || tok == 0 {
				t.Errorf("DISLOCK_TOKEN %q", parts[1])
			}
			if d, err := time.Parse(time.RFC3339, parts[2]); err != nil || d.Before(time.Now().Add(-time.Second)) || d.After(time.Now().Add(time.Minute)) {
				t.Errorf("DISLOCK_DEADLINE %q: %v", parts[2], err)
			}
			for _, l := range lines[1:] {
				if !strings.Contains(l, "\theld\t") {
					t.Errorf("%s: lock not held while the command runs: %q", strategy, l)
				}
			}
			// Afterwards: the lease is free, the slot is kept until its end.
			st := run(t, f.baseEnv(), "list", "--url-env", urlVar, "cronjob-lock:")
			if !strings.Contains(st.stdout.String(), schedulePrefix+key) || strings.Contains(st.stdout.String(), leasePrefix+key) {
				t.Errorf("%s: after the run, list shows:\n%s", strategy, st.output())
			}
		}
	})
}

// Operators see and break locks with status, list and release --force; the
// holder then loses its lease.
func TestAdmin(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) { testAdmin(t, f, "10") })
}

// testAdmin holds a lease lock of ttl seconds on f and has status, list and
// release --force see and break it; release asks for --force.
func testAdmin(t *testing.T, f *fixture, ttl string) {
	key := f.newKey(t)
	lockKey := leasePrefix + key
	env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease", "RUN_LOCK_TTL_SECONDS="+ttl, "LOCK_LEASE_INTERVAL=0.3", "DISLOCK_GRACE_SECONDS=1")
	holder := startHolding(t, env, "sleep 300")
	admin := f.baseEnv()

	st := run(t, admin, "status", "--url-env", urlVar, lockKey)
	expectCode(t, st, 0)
	if !strings.Contains(st.stdout.String(), "held") {
		t.Fatalf("status: %s", st.output())
	}
	ls := run(t, admin, "list", "--url-env", urlVar, leasePrefix)
	if !strings.Contains(ls.stdout.String(), lockKey) {
		t.Fatalf("list: %s", ls.output())
	}
	rel := run(t, admin, "release", "--url-env", urlVar, lockKey)
	expectCode(t, rel, exitUsage)
	if !strings.Contains(rel.stderr.String(), "--force") {
		t.Errorf("release without --force: %s", rel.output())
	}
	rel = run(t, admin, "release", "--url-env", urlVar, lockKey, "--force")
	expectCode(t, rel, 0)
	if !strings.Contains(rel.stdout.String(), "released") {
		t.Fatalf("release: %s", rel.output())
	}
	if code := holder.wait(t, 20*time.Second); code != exitLeaseLost {
		t.Fatalf("holder: exit %d: %s", code, holder.output())
	}
	st = run(t, admin, "status", "--url-env", urlVar, lockKey)
	if !strings.Contains(st.stdout.String(), "free") {
		t.Fatalf("status after release: %s", st.output())
	}
}

// testRunAndBusy runs a command under a lease lock on f while another holds
// it (it does not run) and after the holder ended (it runs).
func testRunAndBusy(t *testing.T, f *fixture) {
	env := f.baseEnv("LOCK_KEY="+f.newKey(t), "LOCK_STRATEGY=lease", "RUN_LOCK_TTL_SECONDS=5")
	holder := startHolding(t, env, "sleep 300")
	busy := run(t, env, urlVar, "sh", "-c", "echo ran")
	expectCode(t, busy, 0)
	if strings.Contains(busy.stdout.String(), "ran") {
		t.Fatalf("the command ran while the lock was held: %s", busy.output())
	}
	holder.cmd.Process.Signal(os.Interrupt)
	holder.wait(t, 20*time.Second)
	ok := run(t, env, urlVar, "sh", "-c", "echo ran")
	expectCode(t, ok, 0)
	if !strings.Contains(ok.stdout.String(), "ran") {
		t.Fatalf("the command did not run after the holder ended: %s", ok.output())
	}
}

// Every bad setting is exit 2 with a message naming it, before any
// connection; the password in the URL never appears.
func TestBadSettingsProcess(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	pgURL := "postgres://user:" + sentinel + "@127.0.0.1:1/db"
	ok := []string{urlVar + "=" + pgURL, "LOCK_KEY=k", "CRON_SCHEDULE=@hourly"}
	cases := []struct {
		env  []string
		args []string
		want string
	}{
		{[]string{"LOCK_KEY="}, nil, "LOCK_KEY"},
		{[]string{"LOCK_STRATEGY=sometimes"}, nil, "LOCK_STRATEGY"},
		{[]string{"CRON_SCHEDULE="}, nil, "CRON_SCHEDULE"},
		{[]string{"CRON_SCHEDULE=99 * * * *"}, nil, "CRON_SCHEDULE"},
		{[]string{"CRON_SCHEDULE=*/61 * * * *"}, nil, "minute field"},
		{[]string{"CRON_SCHEDULE=*/30 * * * * *"}, nil, "@every"},
		{[]string{"DISLOCK_CREATE_TABLE=perhaps"}, nil, "DISLOCK_CREATE_TABLE"},
		{[]string{"RUN_LOCK_TTL_SECONDS=soon"}, nil, "RUN_LOCK_TTL_SECONDS"},
		{[]string{"RUN_LOCK_TTL_SECONDS=-1"}, nil, "RUN_LOCK_TTL_SECONDS"},
		{[]string{"LOCK_LEASE_INTERVAL=61"}, nil, "LOCK_LEASE_INTERVAL"},
		{[]string{"LOCK_LEASE_INTERVAL=x"}, nil, "LOCK_LEASE_INTERVAL"},
		{[]string{"LOCK_JITTER_SECONDS=-3"}, nil, "LOCK_JITTER_SECONDS"},
		{[]string{"LOCK_JITTER_SECONDS=abc"}, nil, "LOCK_JITTER_SECONDS"},
		{[]string{"LOCK_ON_LEASE_LOSS=pray"}, nil, "LOCK_ON_LEASE_LOSS"},
		{[]string{"DISLOCK_GRACE_SECONDS=-1"}, nil, "DISLOCK_GRACE_SECONDS"},
		{[]string{"DISLOCK_BUSY_EXIT_CODE=256"}, nil, "DISLOCK_BUSY_EXIT_CODE"},
		{[]string{"LOCK_STRATEGY=lease", "LOCK_LIMIT=0"}, nil, "LOCK_LIMIT"},
		{[]string{"LOCK_STRATEGY=lease", "LOCK_LIMIT=-1"}, nil, "LOCK_LIMIT"},
		{[]string{"LOCK_STRATEGY=lease", "LOCK_LIMIT=two"}, nil, "LOCK_LIMIT"},
		{[]string{"LOCK_STRATEGY=lease", "LOCK_LIMIT=10001"}, nil, "LOCK_LIMIT"},
		{[]string{"LOCK_LIMIT=2"}, nil, "LOCK_LIMIT"},
		{[]string{"LOCK_STRATEGY=lease"}, []string{"--limit", "0"}, "--limit"},
		{[]string{"LOCK_TABLE=" + strings.Repeat("t", 70)}, nil, "LOCK_TABLE"},
		{[]string{"LOCK_TABLE=public."}, nil, "LOCK_TABLE"},
		{[]string{urlVar + "=mongodb://user:" + sentinel + "@db/x"}, nil, "unknown scheme"},
		{[]string{urlVar + "=mysql://user:" + sentinel + "@/x"}, nil, "names no host"},
		{[]string{urlVar + "=mysql://user:" + sentinel + "@db"}, nil, "names no database"},
		{[]string{urlVar + "=mysql://user:" + sentinel + "@db/x?timeout=soon"}, nil, "cannot be parsed"},
		{[]string{urlVar + "=mysql://user:" + sentinel + "@db/x", "LOCK_TABLE=bad-name"}, nil, "LOCK_TABLE"},
		{[]string{urlVar + "=user:" + sentinel + "@db"}, nil, urlVar},
		{[]string{urlVar + "=postgres://user:" + sentinel + "@db:notaport/x"}, nil, urlVar},
		{[]string{urlVar + "=redis://user:" + sentinel + "@db:notaport/x"}, nil, urlVar},
		{[]string{urlVar + "=redis+sentinel://user:" + sentinel + "@h1:1,h2:2/0"}, nil, "master_name"},
		{nil, []string{"--ttl", "0"}, "--ttl"},
		{nil, []string{"--nope"}, "nope"},
		{nil, []string{"UNSET_VARIABLE_FOR_URL"}, "UNSET_VARIABLE_FOR_URL"},
	}
	for _, tc := range cases {
		var f *fixture
		env := f.baseEnv(append(append([]string{}, ok...), tc.env...)...)
		args := tc.args
		if len(args) == 0 || strings.HasPrefix(args[0], "--") {
			args = append(args, urlVar)
		}
		p := run(t, env, append(args, "touch", marker)...)
		if p.code != exitUsage || !strings.Contains(p.stderr.String(), tc.want) {
			t.Errorf("%v %v: exit %d, want 2 naming %s:\n%s", tc.env, tc.args, p.code, tc.want, p.output())
		}
		noSentinel(t, p)
		if exists(marker) {
			t.Fatalf("%v: the command ran", tc.env)
		}
	}
	// Usage errors of the subcommands.
	for _, args := range [][]string{{"status"}, {"release", "k"}, {"list", "a", "b"}, {}} {
		var f *fixture
		p := run(t, f.baseEnv(ok...), args...)
		expectCode(t, p, exitUsage)
		noSentinel(t, p)
	}
}

// A password in the URL appears in no output, whatever the log level, for a
// run that succeeds (where the server accepts it) or fails.
func TestNoPasswordInOutput(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		u, err := url.Parse(f.url)
		if err != nil {
			t.Fatal(err)
		}
		name := "postgres"
		if u.User != nil {
			name = u.User.Username()
		}
		u.User = url.UserPassword(name, sentinel)
		env := f.baseEnv(urlVar+"="+u.String(), "LOCK_KEY="+f.newKey(t), "LOCK_STRATEGY=schedule,lease", "CRON_SCHEDULE=@hourly", "CRONJOB_LOCK_LOG_LEVEL=DEBUG")
		for _, args := range [][]string{
			{urlVar, "true"},
			{urlVar, "sh", "-c", "exit 7"},
			{"list", "--url-env", urlVar},
			{"status", "--url-env", urlVar, "x"},
		} {
			p := run(t, env, args...)
			noSentinel(t, p)
		}
	})
}

// An unknown log level is a bad setting like any other: exit 2 naming it,
// and the command does not run.
func TestUnknownLogLevel(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		marker := filepath.Join(t.TempDir(), "ran")
		env := f.baseEnv("LOCK_KEY="+f.newKey(t), "LOCK_STRATEGY=lease", "CRONJOB_LOCK_LOG_LEVEL=CHATTY")
		p := run(t, env, urlVar, "touch", marker)
		expectCode(t, p, exitUsage)
		if !strings.Contains(p.stderr.String(), "CRONJOB_LOCK_LOG_LEVEL") || exists(marker) {
			t.Errorf("an unknown level: %s", p.output())
		}
	})
}

// A PostgreSQL table in the older 3-column layout (key, value, expire_at) is
// used as it is, without fencing tokens.
func TestLegacyTable(t *testing.T) {
	u := testenv.PG(t)
	table := testenv.Name("dislock_cli_legacy_")
	ctx := context.Background()
	conn := pgConn(t, u)
	dropAtCleanup(t, conn, table)
	ident := pgx.Identifier{table}.Sanitize()
	if _, err := conn.Exec(ctx, "CREATE TABLE "+ident+" (key text PRIMARY KEY, value text NOT NULL, expire_at timestamptz NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	f := &fixture{url: u, env: []string{"LOCK_TABLE=" + table}}
	key := f.newKey(t)
	p := run(t, f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease"), urlVar, "sh", "-c", `echo "$DISLOCK_TOKEN"; `+
		fmt.Sprintf(`"%s" status --url-env %s %s%s`, binary, urlVar, leasePrefix, key))
	expectCode(t, p, 0)
	if !strings.HasPrefix(p.stdout.String(), "0\n") || !strings.Contains(p.stdout.String(), "\theld\t") {
		t.Fatalf("output: %s", p.output())
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+ident).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows left: %d %v", n, err)
	}
}

// When the store becomes unreachable, the session is lost at its renew
// deadline and the group (here ignoring SIGTERM, with a long grace period) is
// killed while the server still holds the lease: nobody else can have the
// lock before the command is dead.
func TestStoreUnreachable(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		u, err := url.Parse(f.url)
		if err != nil {
			t.Fatal(err)
		}
		proxy := newCutProxy(t, u.Host)
		u.Host = proxy.ln.Addr().String()
		dir := t.TempDir()
		pidFile := filepath.Join(dir, "pid")
		key := f.newKey(t)
		env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease", "RUN_LOCK_TTL_SECONDS=10",
			"LOCK_LEASE_INTERVAL=0.3", "DISLOCK_GRACE_SECONDS=60", urlVar+"="+u.String())
		p := start(t, env, urlVar, "sh", "-c", `trap "" TERM; sleep 300 & echo $! > `+pidFile+`; while :; do wait; done`)
		pid, err := strconv.Atoi(waitFile(t, pidFile, 20*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		proxy.cut()
		// The release that follows may take a while against a store that
		// is down: look at the server as soon as the group is dead.
		waitGone(t, pid, 30*time.Second)
		if !f.held(t, leasePrefix+key) {
			t.Fatalf("the lease expired on the server before the group was killed\n%s", p.stderr.String())
		}
		if code := p.wait(t, 30*time.Second); code != exitLeaseLost {
			t.Fatalf("exit %d, want 75: %s", code, p.output())
		}
		// Driver messages go through the redacting logger too.
		for _, line := range strings.Split(strings.TrimSpace(p.stderr.String()), "\n") {
			if !strings.HasPrefix(line, "time=") {
				t.Errorf("stderr line not from the logger: %q", line)
			}
		}
	})
}
