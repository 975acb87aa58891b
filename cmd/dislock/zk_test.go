package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/internal/zktest"
)

// zkURL is a zk:// URL on a private ZooKeeper server with a stock install's
// settings (tickTime 2000, so sessions of at most 40 s) started for the test
// (stopped by PID when it ends), or DISLOCK_TEST_ZK when set. Under CI a
// missing ZooKeeper install fails the test.
func zkURL(t *testing.T) string {
	t.Helper()
	if u := os.Getenv("DISLOCK_TEST_ZK"); u != "" {
		return u
	}
	return "zk://" + zktest.ForTest(t, true).Connect() + "/" + testenv.Name("clitest")
}

// TestZooKeeper runs a command under a ZooKeeper lock, and the operator
// subcommands status, list and release --force on it.
func TestZooKeeper(t *testing.T) {
	f := &fixture{name: "zookeeper", url: zkURL(t)}
	t.Run("RunAndBusy", func(t *testing.T) { testRunAndBusy(t, f) })
	// On a stock server the default TTL (60 s) does not fit the session
	// (40 s at most): the run takes what the granted session allows. A TTL
	// asked for that does not fit is exit 2 naming the setting and the
	// session granted of the one asked, and takes no slot.
	t.Run("DefaultTTLFitsTheSession", func(t *testing.T) {
		if os.Getenv("DISLOCK_TEST_ZK") != "" {
			t.Skip("the server's session limits are not known")
		}
		marker := filepath.Join(t.TempDir(), "ran")
		p := run(t, f.baseEnv("LOCK_KEY="+f.newKey(t), "LOCK_STRATEGY=schedule,lease", "CRON_SCHEDULE=@daily"), urlVar, "touch", marker)
		expectCode(t, p, 0)
		if !exists(marker) {
			t.Fatalf("the command did not run: %s", p.output())
		}
	})
	t.Run("TTLTooLongForTheSession", func(t *testing.T) {
		if os.Getenv("DISLOCK_TEST_ZK") != "" {
			t.Skip("the server's session limits are not known")
		}
		key := f.newKey(t)
		env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=schedule,lease", "CRON_SCHEDULE=@daily", "RUN_LOCK_TTL_SECONDS=60")
		p := run(t, env, urlVar, "true")
		expectCode(t, p, exitUsage)
		msg := p.stderr.String()
		for _, want := range []string{"RUN_LOCK_TTL_SECONDS (--ttl)", "granted: 40s (of the 1m30s asked)"} {
			if !strings.Contains(msg, want) {
				t.Fatalf("the error does not say %q: %s", want, p.output())
			}
		}
		marker := filepath.Join(t.TempDir(), "ran")
		ok := run(t, f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=schedule,lease", "CRON_SCHEDULE=@daily", "RUN_LOCK_TTL_SECONDS=20"), urlVar, "touch", marker)
		expectCode(t, ok, 0)
		if !exists(marker) {
			t.Fatalf("the refused run used up the slot: %s", ok.output())
		}
	})
	t.Run("Admin", func(t *testing.T) { testAdmin(t, f, "10") })
	t.Run("Limit", func(t *testing.T) { limitProcess(t, f) })
	t.Run("Auth", func(t *testing.T) {
		// Credentials in the URL: digest authentication, and nodes closed
		// to sessions without them. The password is never printed.
		open := f.url + "-auth" // a chroot of its own
		authURL := strings.Replace(open, "zk://", "zk://dislock:"+sentinel+"@", 1)
		key := f.newKey(t)
		env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease", "RUN_LOCK_TTL_SECONDS=5", "CRONJOB_LOCK_LOG_LEVEL=DEBUG")
		ok := run(t, append(env, urlVar+"="+authURL), urlVar, "sh", "-c", "echo ran")
		expectCode(t, ok, 0)
		noSentinel(t, ok)
		if !strings.Contains(ok.stdout.String(), "ran") {
			t.Fatalf("the command did not run with credentials: %s", ok.output())
		}
		// The run has ended: status, with the credentials, finds the lock free.
		st := run(t, append(f.baseEnv(), urlVar+"="+authURL), "status", "--url-env", urlVar, leasePrefix+key)
		expectCode(t, st, exitFree)
		if !strings.Contains(st.stdout.String(), "free") {
			t.Fatalf("status: %s", st.output())
		}
		noSentinel(t, st)
		// Without the credentials the run fails (exit 1), and the
		// command does not run.
		anon := run(t, append(env, urlVar+"="+open), urlVar, "sh", "-c", "echo ran")
		expectCode(t, anon, exitFailure)
		if strings.Contains(anon.stdout.String(), "ran") {
			t.Fatalf("the command ran without the credentials: %s", anon.output())
		}
	})
	t.Run("BadURL", func(t *testing.T) {
		for _, u := range []string{"zk://", "zk:///chroot", "zk://user:" + sentinel + "@", "zk://user:" + sentinel + "@h:2181?nope=1", "zk://" + sentinel + "@h:2181", "zk://h:2181?nope=1", "zk://h:2181?session_timeout=x"} {
			p := run(t, f.baseEnv("LOCK_KEY=k", urlVar+"="+u), urlVar, "true")
			expectCode(t, p, exitUsage)
			noSentinel(t, p)
		}
	})
}

// The redaction covers a ZooKeeper URL's digest credentials, whatever the
// host list and chroot around them.
func TestRedactZK(t *testing.T) {
	for u, pw := range map[string]string{
		"zk://jobs:" + sentinel + "@h1:2181,h2:2181,h3:2181/app?session_timeout=30": sentinel,
		"zk://jobs:" + sentinel + "@h1:2181":                                        sentinel,
		"zk://jobs:" + sentinel + "%40x@[::1]:2181,h2:2181/c":                       sentinel + "@x",
	} {
		r := newRedactor(urlVar, u)
		for _, in := range []string{"dial " + u + " failed", "auth jobs:" + pw + " rejected", "digest " + pw} {
			if out := r.String(in); strings.Contains(out, sentinel) {
				t.Errorf("%q -> %q still contains the password", in, out)
			}
		}
	}
}
