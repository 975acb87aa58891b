package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/internal/zktest"
)

// zkURL is a zk:// URL on a private ZooKeeper server started for the test
// (stopped by PID when it ends), or DISLOCK_TEST_ZK when set. Under CI a
// missing ZooKeeper install fails the test.
func zkURL(t *testing.T) string {
	t.Helper()
	if u := os.Getenv("DISLOCK_TEST_ZK"); u != "" {
		return u
	}
	if err := zktest.Installed(); err != nil {
		if testenv.CI() {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	e, err := zktest.Start(t.TempDir(), 1, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Stop)
	return "zk://" + e.Connect() + "/" + testenv.Name("clitest")
}

// TestZooKeeper runs a command under a ZooKeeper lock, and the operator
// subcommands status, list and release --force on it.
func TestZooKeeper(t *testing.T) {
	f := &fixture{name: "zookeeper", url: zkURL(t)}
	t.Run("RunAndBusy", func(t *testing.T) {
		dir := t.TempDir()
		started := filepath.Join(dir, "started")
		key := f.newKey(t)
		env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease", "RUN_LOCK_TTL_SECONDS=5")
		holder := start(t, env, urlVar, "sh", "-c", "echo go > "+started+"; sleep 300")
		waitFile(t, started, 20*time.Second)
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
	})
	t.Run("TTLTooLongForTheSession", func(t *testing.T) {
		env := f.baseEnv("LOCK_KEY="+f.newKey(t), "LOCK_STRATEGY=lease", "RUN_LOCK_TTL_SECONDS=60")
		p := run(t, append(env, urlVar+"="+f.url+"?session_timeout=30"), urlVar, "true")
		expectCode(t, p, exitUsage)
		if !strings.Contains(p.stderr.String(), "session timeout") {
			t.Fatalf("a TTL above 2/3 of the session timeout: %s", p.output())
		}
	})
	t.Run("Admin", func(t *testing.T) {
		dir := t.TempDir()
		started := filepath.Join(dir, "started")
		key := f.newKey(t)
		lockKey := leasePrefix + key
		env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease", "RUN_LOCK_TTL_SECONDS=10", "LOCK_LEASE_INTERVAL=0.3", "DISLOCK_GRACE_SECONDS=1")
		holder := start(t, env, urlVar, "sh", "-c", "echo go > "+started+"; sleep 300")
		waitFile(t, started, 20*time.Second)
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
		rel := run(t, admin, "release", "--url-env", urlVar, lockKey, "--force")
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
	})
	t.Run("Limit", func(t *testing.T) { limitProcess(t, f) })
	t.Run("BadURL", func(t *testing.T) {
		for _, u := range []string{"zk://", "zk:///chroot", "zk://user:" + sentinel + "@h:2181", "zk://h:2181?nope=1", "zk://h:2181?session_timeout=x"} {
			p := run(t, f.baseEnv("LOCK_KEY=k", urlVar+"="+u), urlVar, "true")
			expectCode(t, p, exitUsage)
			noSentinel(t, p)
		}
	})
}
