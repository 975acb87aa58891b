package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dislock/dislock/internal/testenv"
)

// After a loss by the local renew deadline the store still holds the key
// (here: renewals get no reply, releases on new connections go through).
// The key must stay held while any process of the command's group runs, and
// dislock's release must free it once the group is gone, before the TTL.
func TestLossReleasedAfterGroup(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		var proxy *testenv.StallProxy
		u := f.viaProxy(t, func(target string) string {
			proxy = testenv.NewStallProxy(t, "tcp", target)
			return proxy.Addr()
		})
		dir := t.TempDir()
		pidFile := filepath.Join(dir, "pid")
		key := f.newKey(t)
		lockKey := leasePrefix + key
		// TTL 9s: renew deadline 6s, so the store keeps the key 3s past the
		// loss; the shell ignores SIGTERM and lives 1s (the grace) past it.
		env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease", "RUN_LOCK_TTL_SECONDS=9",
			"LOCK_LEASE_INTERVAL=0.3", "DISLOCK_GRACE_SECONDS=1", urlVar+"="+u)
		p := start(t, env, urlVar, "sh", "-c", `trap "" TERM; sleep 300 & echo $$ $! > `+pidFile+`; while :; do wait; done`)
		pids := readPIDs(t, pidFile)
		shell := pids[0]
		if !f.held(t, lockKey) {
			t.Fatalf("the lease is not held while the command runs: %s", p.output())
		}
		proxy.StallOpen()
		stalled := time.Now()

		var goneAt, freedAt time.Time
		for end := stalled.Add(30 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			held := f.held(t, lockKey) // before looking at the group: processes do not come back
			alive := !processGone(shell)
			if !alive && goneAt.IsZero() {
				goneAt = time.Now()
			}
			if !held {
				freedAt = time.Now()
				if alive {
					syscall.Kill(shell, syscall.SIGKILL)
					t.Fatalf("the store freed the key %v after the stall while the command (pid %d) still ran\n%s",
						freedAt.Sub(stalled).Round(time.Millisecond), shell, p.stderr.String())
				}
				break
			}
		}
		if code := p.wait(t, 20*time.Second); code != exitLeaseLost {
			t.Fatalf("exit %d, want 75: %s", code, p.output())
		}
		if freedAt.IsZero() {
			t.Fatalf("the key was never freed\n%s", p.stderr.String())
		}
		// Freed by dislock's release (just after the group died), not by the
		// TTL (at least 3s after the loss, 2s after the group died).
		if d := freedAt.Sub(goneAt); d > 1500*time.Millisecond {
			t.Errorf("the key was freed %v after the group was gone: not by dislock's release\n%s", d.Round(time.Millisecond), p.stderr.String())
		}
		waitGone(t, pids[1], time.Second)
		t.Logf("key freed %v after the stall, %v after the group was gone; dislock exited %v after the stall",
			freedAt.Sub(stalled).Round(time.Millisecond), freedAt.Sub(goneAt).Round(time.Millisecond), p.ended.Sub(stalled).Round(time.Millisecond))
	})
}

// When dislock is killed with SIGKILL it can terminate nothing; the command
// (started with a parent-death signal) must die with it, long before the
// lease could expire and another instance start.
func TestKilledDislockKillsCommand(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		dir := t.TempDir()
		pidFile := filepath.Join(dir, "pid")
		key := f.newKey(t)
		env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease", "RUN_LOCK_TTL_SECONDS=30")
		// The shell execs the job, so that the job is the command itself.
		p := start(t, env, urlVar, "sh", "-c", "echo $$ > "+pidFile+"; exec sleep 300 >/dev/null 2>&1")
		pid := readPIDs(t, pidFile)[0]
		if err := p.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-p.done
		killed := time.Now()
		waitGone(t, pid, 3*time.Second)
		t.Logf("the command died %v after dislock was killed", time.Since(killed).Round(time.Millisecond))
		if !f.held(t, leasePrefix+key) {
			t.Errorf("the lease is not held any more: the test proves nothing")
		}
	})
}

// After the store refused a renewal (the key was taken over) there is no
// margin left: SIGKILL follows SIGTERM within a second, whatever the grace
// period and the TTL.
func TestRefusedLeaseTerminatesAtOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		dir := t.TempDir()
		pidFile := filepath.Join(dir, "pid")
		key := f.newKey(t)
		env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease", "RUN_LOCK_TTL_SECONDS=30",
			"LOCK_LEASE_INTERVAL=0.3", "DISLOCK_GRACE_SECONDS=60")
		p := start(t, env, urlVar, "sh", "-c", `trap "" TERM; sleep 300 & echo $$ $! > `+pidFile+`; while :; do wait; done`)
		pids := readPIDs(t, pidFile)
		f.steal(t, leasePrefix+key)
		stolen := time.Now()
		if code := p.wait(t, 45*time.Second); code != exitLeaseLost {
			t.Fatalf("exit %d, want 75: %s", code, p.output())
		}
		// Next renewal (0.3s) refused, then SIGTERM and SIGKILL 1s later.
		took := p.ended.Sub(stolen)
		if took < 900*time.Millisecond || took > 4*time.Second {
			t.Errorf("the group was killed %v after the key was taken over, want 0.9s…4s\n%s", took.Round(time.Millisecond), p.stderr.String())
		}
		for _, pid := range pids {
			waitGone(t, pid, time.Second)
		}
		if !strings.Contains(p.stderr.String(), "at once") || !strings.Contains(p.stderr.String(), "SIGKILL") {
			t.Errorf("the immediate termination is not logged: %s", p.stderr.String())
		}
	})
}

// Processes the command leaves in its group when it exits are terminated
// (SIGTERM, then SIGKILL after the grace period) before the lock is
// released; the command's own exit code is kept.
func TestStragglersTerminated(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		for _, tc := range []struct {
			name     string
			straggle string // a shell command run in the background
			min      time.Duration
		}{
			{"term", "exec sleep 300", 0},
			{"kill", `trap "" TERM; exec sleep 300`, 900 * time.Millisecond},
		} {
			t.Run(tc.name, func(t *testing.T) {
				dir := t.TempDir()
				pidFile := filepath.Join(dir, "pid")
				key := f.newKey(t)
				env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease", "DISLOCK_GRACE_SECONDS=1")
				script := fmt.Sprintf(`sh -c '%s' >/dev/null 2>&1 </dev/null & echo $! > %s; exit 3`, tc.straggle, pidFile)
				p := start(t, env, urlVar, "sh", "-c", script)
				pid := readPIDs(t, pidFile)[0]
				if code := p.wait(t, 20*time.Second); code != 3 {
					t.Fatalf("exit %d, want the command's 3: %s", code, p.output())
				}
				if !processGone(pid) {
					t.Fatalf("dislock exited while process %d of the command's group still ran\n%s", pid, p.stderr.String())
				}
				if took := p.ended.Sub(p.started); took < tc.min {
					t.Errorf("dislock exited after %v, before the grace period ended", took)
				}
				if !strings.Contains(p.stderr.String(), "terminating them") {
					t.Errorf("the stragglers are not logged: %s", p.stderr.String())
				}
				st := run(t, f.baseEnv(), "status", "--url-env", urlVar, leasePrefix+key)
				if !strings.Contains(st.stdout.String(), "free") {
					t.Fatalf("lock not released: %s", st.output())
				}
			})
		}
	})
}
