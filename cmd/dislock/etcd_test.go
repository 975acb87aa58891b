package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/etcdlock/etcdtest"
)

// TestEtcd runs a command under an etcd lock, and the operator subcommands
// status, list and release --force on it.
func TestEtcd(t *testing.T) {
	f := &fixture{name: "etcd", url: etcdtest.URL(t)}
	t.Run("RunAndBusy", func(t *testing.T) { testRunAndBusy(t, f) })
	t.Run("ScheduleSlot", func(t *testing.T) {
		// One run per slot: a second start in the same hourly slot finds it
		// taken, even though the first run has ended.
		env := f.baseEnv("LOCK_KEY="+f.newKey(t), "LOCK_STRATEGY=schedule", "CRON_SCHEDULE=@hourly")
		first := run(t, env, urlVar, "sh", "-c", "echo ran")
		expectCode(t, first, 0)
		if !strings.Contains(first.stdout.String(), "ran") {
			t.Fatalf("the first start of the slot did not run: %s", first.output())
		}
		second := run(t, env, urlVar, "sh", "-c", "echo ran")
		expectCode(t, second, 0)
		if strings.Contains(second.stdout.String(), "ran") {
			t.Fatalf("a second start in the same slot ran: %s", second.output())
		}
	})
	t.Run("Admin", func(t *testing.T) { testAdmin(t, f, "3") })
	t.Run("Credentials", func(t *testing.T) {
		// A private server with authentication on: the password in the URL
		// is used, and never shows, whether it is right or wrong.
		c := etcdtest.Start(t, 1)
		cli := c.Client(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := cli.UserAdd(ctx, "root", sentinel); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.UserGrantRole(ctx, "root", "root"); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.AuthEnable(ctx); err != nil {
			t.Fatal(err)
		}
		good := strings.Replace(c.URL(), "etcd://", "etcd://root:"+sentinel+"@", 1)
		bad := strings.Replace(c.URL(), "etcd://", "etcd://root:wrong"+sentinel+"@", 1)
		env := f.baseEnv("LOCK_KEY="+f.newKey(t), "LOCK_STRATEGY=lease", "CRONJOB_LOCK_LOG_LEVEL=DEBUG")
		p := run(t, append(env, urlVar+"="+good), urlVar, "sh", "-c", "echo ran")
		expectCode(t, p, 0)
		if !strings.Contains(p.stdout.String(), "ran") {
			t.Fatalf("the command did not run with the right password: %s", p.output())
		}
		noSentinel(t, p)
		p = run(t, append(env, urlVar+"="+bad), urlVar, "sh", "-c", "echo ran")
		if p.code == 0 || strings.Contains(p.stdout.String(), "ran") {
			t.Fatalf("ran with a wrong password: %s", p.output())
		}
		noSentinel(t, p)
		st := run(t, f.baseEnv(urlVar+"="+bad, "CRONJOB_LOCK_LOG_LEVEL=DEBUG"), "status", "--url-env", urlVar, "k")
		noSentinel(t, st)
	})
	t.Run("Limit", func(t *testing.T) { limitProcess(t, f) })
	// After the server stops, dislock terminates the command at the renew
	// deadline, and the release and the close that follow are bounded by
	// the lease's margin: dislock exits before the server's lease could
	// have run out (TTL after the last renewal, which came at most 0.3 s
	// before the kill). Before, it took the deadline plus 5 s plus 5 s.
	t.Run("ExitWithinTheLease", func(t *testing.T) {
		t.Parallel()
		c := etcdtest.Start(t, 1)
		const ttl = 9 * time.Second
		env := f.baseEnv(urlVar+"="+c.URL(), "LOCK_KEY="+f.newKey(t), "LOCK_STRATEGY=lease", "RUN_LOCK_TTL_SECONDS=9", "LOCK_LEASE_INTERVAL=0.3")
		p := startHolding(t, env, "exec sleep 300")
		c.Kill(0)
		killed := time.Now()
		if code := p.wait(t, 60*time.Second); code != exitLeaseLost {
			t.Fatalf("exit %d, want 75: %s", code, p.output())
		}
		if took := p.ended.Sub(killed); took > ttl {
			t.Fatalf("dislock exited %v after the server stopped, after the lease (TTL %v) could have expired:\n%s", took, ttl, p.output())
		}
	})
	t.Run("BadURL", func(t *testing.T) {
		for _, u := range []string{"etcd://", "etcds://", "etcd://u:" + sentinel + "@", "etcd://u:" + sentinel + "@h:2379/path",
			"etcd://h:2379?x=" + sentinel, "etcd://a:1,,b:2"} {
			p := run(t, f.baseEnv("LOCK_KEY=k", urlVar+"="+u), urlVar, "true")
			expectCode(t, p, exitUsage)
			noSentinel(t, p)
		}
	})
}
