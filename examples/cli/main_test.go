package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dislock/dislock/internal/testenv"
)

func TestAlone(t *testing.T) {
	t.Setenv("DISLOCK_KEY", "")
	var out strings.Builder
	if err := run([]string{"-work", "1ms"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "no lock held") || !strings.Contains(out.String(), "job: done") {
		t.Errorf("output:\n%s", out.String())
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
