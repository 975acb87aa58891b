package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A lease taken from outside while the command runs, with no renewal in
// between to notice (TTL 60s: renewals every 10s), is found at the
// release: dislock logs it at WARNING, naming the key and the holder the
// store has now. The command's exit code passes through.
func TestLeaseGoneAtRelease(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		dir := t.TempDir()
		started, proceed := filepath.Join(dir, "started"), filepath.Join(dir, "proceed")
		key := f.newKey(t)
		env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease", "RUN_LOCK_TTL_SECONDS=60")
		p := start(t, env, urlVar, "sh", "-c", "echo up > "+started+"; while [ ! -e "+proceed+" ]; do sleep 0.02; done")
		waitFile(t, started, 20*time.Second)
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
