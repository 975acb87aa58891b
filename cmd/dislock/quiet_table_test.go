package main

import (
	"strings"
	"testing"
)

// LOCK_TABLE given to a backend without tables is noted at DEBUG only: at
// the default level a run prints nothing, so cron does not mail every run.
func TestLockTableIgnoredQuietly(t *testing.T) {
	f := redisFixture(t)
	env := f.baseEnv("LOCK_KEY="+f.newKey(t), "LOCK_STRATEGY=lease", "LOCK_TABLE=jobs_locks")
	p := run(t, env, urlVar, "true")
	expectCode(t, p, 0)
	if out := p.output(); out != "" {
		t.Errorf("a successful run with LOCK_TABLE on Redis printed:\n%s", out)
	}
	p = run(t, append(env, "CRONJOB_LOCK_LOG_LEVEL=DEBUG"), urlVar, "true")
	expectCode(t, p, 0)
	if !strings.Contains(p.stderr.String(), "LOCK_TABLE is ignored by the Redis backend") {
		t.Errorf("DEBUG does not note the ignored LOCK_TABLE:\n%s", p.stderr.String())
	}
}
