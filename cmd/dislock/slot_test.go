package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dislock/dislock/internal/testenv"
)

// A schedule slot belongs to a run that started its command: a command
// that cannot be found or started, and a run that finds the lease held
// (schedule,lease), leave the slot to the next run of the same slot, which
// runs and whose log names only runs that started.
func TestSlotForRunsThatStarted(t *testing.T) {
	forEachBackend(t, func(t *testing.T, f *fixture) {
		dir := t.TempDir()
		bad := filepath.Join(dir, "bad-interpreter")
		if err := os.WriteFile(bad, []byte("#!/nonexistent/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name string
			cmd  []string
		}{
			{"MissingCommand", []string{"/nonexistent/command"}},
			{"NotStartable", []string{bad}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				env := f.baseEnv("LOCK_KEY="+f.newKey(t), "CRON_SCHEDULE=@daily", "CRONJOB_LOCK_LOG_LEVEL=INFO")
				expectCode(t, run(t, env, append([]string{urlVar}, tc.cmd...)...), exitFailure)
				marker := filepath.Join(t.TempDir(), "ran")
				p := run(t, env, urlVar, "touch", marker)
				expectCode(t, p, 0)
				if !exists(marker) {
					t.Fatalf("the slot was used up by a run whose command did not start:\n%s", p.output())
				}
			})
		}
		t.Run("LeaseHeld", func(t *testing.T) {
			key := f.newKey(t)
			started := filepath.Join(t.TempDir(), "started")
			holder := start(t, f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=lease"), urlVar, "sh", "-c", "echo go > "+started+"; exec sleep 300")
			waitFile(t, started, 20*time.Second)
			env := f.baseEnv("LOCK_KEY="+key, "LOCK_STRATEGY=schedule,lease", "CRON_SCHEDULE=@daily", "CRONJOB_LOCK_LOG_LEVEL=INFO")
			marker := filepath.Join(t.TempDir(), "ran")
			skipped := run(t, env, urlVar, "touch", marker)
			expectCode(t, skipped, 0)
			if exists(marker) {
				t.Fatalf("ran while the lease was held: %s", skipped.output())
			}
			holder.cmd.Process.Signal(os.Interrupt)
			holder.wait(t, 20*time.Second)
			p := run(t, env, urlVar, "touch", marker)
			expectCode(t, p, 0)
			if !exists(marker) {
				t.Fatalf("the slot was used up by a run that found the lease held:\n%s", p.output())
			}
		})
	})
}

// A schedule that never fires is refused before anything is created, with
// an error naming CRON_SCHEDULE.
func TestScheduleNeverFires(t *testing.T) {
	u := testenv.PG(t)
	table := testenv.Name("dislock_never_")
	t.Cleanup(func() { dropTable(t, u, table) })
	var f *fixture
	env := f.baseEnv(urlVar+"="+u, "LOCK_KEY=never", "CRON_SCHEDULE=0 0 30 2 *", "LOCK_TABLE="+table, "DISLOCK_CREATE_TABLE=1")
	p := run(t, env, urlVar, "true")
	expectCode(t, p, exitUsage)
	if !strings.Contains(p.stderr.String(), "CRON_SCHEDULE") || strings.Contains(p.stderr.String(), "ForSlot") {
		t.Fatalf("the error does not name CRON_SCHEDULE: %s", p.output())
	}
	conn, err := pgx.Connect(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var exists bool
	if err := conn.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatalf("the table %s was created for a schedule that never fires", table)
	}
}
