package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dislock/dislock/etcdlock/etcdtest"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/internal/zktest"
)

func TestAlone(t *testing.T) {
	t.Setenv("DISLOCK_KEY", "")
	for _, v := range []string{"DATABASE_URL", "REDIS_URL", "ETCD_URL", "ZK_URL"} {
		t.Setenv(v, "")
	}
	var out strings.Builder
	if err := run([]string{"-work", "1ms"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "no lock held") || !strings.Contains(out.String(), "job: done") {
		t.Errorf("output:\n%s", out.String())
	}
	// With a server's URL set, it says how to run it under a lock there.
	t.Setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
	out.Reset()
	if err := run([]string{"-work", "1ms"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "dislock REDIS_URL go -C examples run ./cli") || strings.Contains(out.String(), "6379") {
		t.Errorf("output with REDIS_URL set:\n%s", out.String())
	}
}

// TestUnderDislock builds the CLI and this job and runs the job under the
// CLI against each server, as a crontab line would.
func TestUnderDislock(t *testing.T) {
	dir := t.TempDir()
	dislock, job := filepath.Join(dir, "dislock"), filepath.Join(dir, "job")
	// The CLI is a module of its own: build it in its directory.
	for bin, src := range map[string]string{dislock: "../../cmd/dislock", job: "."} {
		build := exec.Command("go", "build", "-o", bin, ".")
		build.Dir = src
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", src, err, out)
		}
	}
	for name, url := range map[string]func(testing.TB) string{"pg": testenv.PG, "redis": testenv.Redis} {
		t.Run(name, func(t *testing.T) {
			u := url(t)
			key := testenv.Name("example-cli-")
			cmd := exec.Command(dislock, "JOB_DB_URL", job, "-work", "10ms")
			cmd.Env = append(os.Environ(), "JOB_DB_URL="+u, "LOCK_KEY="+key, "LOCK_STRATEGY=lease", "CRONJOB_LOCK_LOG_LEVEL=WARNING")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if !strings.Contains(string(out), "job: holding cronjob-lock:lease:"+key) || !strings.Contains(string(out), "job: done") {
				t.Errorf("output:\n%s", out)
			}
		})
	}
}

// TestDemoScript runs demo.sh on each of the four backends, as its
// comment promises, ZooKeeper with a stock server's session limits
// (tickTime 2000): the second instance does not run and says why, the
// listing's label names what it lists, and the third instance waits for the
// lease and runs.
func TestDemoScript(t *testing.T) {
	for name, url := range map[string]func(t *testing.T) string{
		"pg":    func(t *testing.T) string { return testenv.PG(t) },
		"redis": func(t *testing.T) string { return testenv.Redis(t) },
		"zk":    func(t *testing.T) string { return "zk://" + zktest.ForTest(t, true).Connect() },
		"etcd":  func(t *testing.T) string { return etcdtest.Start(t, 1).URL() },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			demoOn(t, url(t))
		})
	}
}

func demoOn(t *testing.T, url string) {
	cmd := exec.Command("sh", "demo.sh")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+url)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("demo.sh: %v\n%s", err, out)
	}
	lines := strings.Split(string(out), "\n")
	listed := false
	for i, l := range lines {
		prefix, ok := strings.CutPrefix(l, "--- dislock list ")
		if !ok {
			continue
		}
		listed = true
		if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], prefix) || !strings.Contains(lines[i+1], "\theld\t") {
			t.Errorf("the label %q does not match the listing %q", l, lines[i+1])
		}
	}
	if !listed {
		t.Errorf("no listing:\n%s", out)
	}
	// The second instance finds the lease held (or the slot taken) and says
	// so; the third waits for the lease and runs: two runs in all.
	second, third, _ := strings.Cut(string(out), "--- third instance")
	if strings.Count(second, "job: holding") != 1 ||
		!strings.Contains(second, "already run") && !strings.Contains(second, "held by another run") {
		t.Errorf("want one run and a second instance that says why it does not run:\n%s", out)
	}
	if strings.Count(third, "job: holding") != 1 || !strings.Contains(third, "third instance exited 0") {
		t.Errorf("want the third instance to wait for the lease and run:\n%s", out)
	}
}
