package main

import (
	"fmt"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/dislock/dislock/examples/internal/extest"
	"github.com/dislock/dislock/internal/testenv"
)

func TestGocronExample(t *testing.T) {
	// A job's run-time request that gocronlock's look-up of the scheduler's
	// location gave up on, or that the scheduler's Shutdown left unanswered,
	// ends by itself within the second gocron bounds every such request to
	// (requestJob): it may still wait when the example has returned.
	defer goleak.VerifyNone(t, goleak.IgnoreTopFunction("github.com/go-co-op/gocron/v2.requestJobCtx"))
	gocronOn(t, "", "", "memlock", "elected leader (fencing token 1)", "elected leader (fencing token 2)")
}

// TestGocronExampleMySQL runs the example on the MySQL / MariaDB of
// DISLOCK_TEST_MYSQL (fencing tokens are the server's microseconds there).
func TestGocronExampleMySQL(t *testing.T) {
	gocronOn(t, "MYSQL_URL", testenv.MySQL(t), "MySQL (MYSQL_URL)")
}

// gocronOn runs the example with only variable set (to url) of the backend
// variables and checks its output: on backend, each tick ran once, and the
// leader handed over; want are more lines it must contain.
func gocronOn(t *testing.T, variable, url, backend string, want ...string) {
	got := extest.Run(t, variable, url, run)
	extest.Contains(t, got, append([]string{
		"backend: " + backend,
		"== elector: one leader runs every job ==",
		"elected leader (fencing token ",
		"heartbeat (token ",
		"the store says the leader is scheduler-",
		"it hands over at once",
		"took over after",
		"== locker: each tick runs on one scheduler ==",
		"report for",
		"each tick ran once: true",
	}, want...)...)
	// The summary counts the runs the schedulers made: as many as the
	// "report for" lines, one per tick.
	var ticks, runs, skips int
	i := strings.Index(got, " ticks, ")
	if i < 0 {
		t.Fatal("no summary")
	}
	start := strings.LastIndex(got[:i], "\n") + 1
	if _, err := fmt.Sscanf(got[start:], "%d ticks, %d runs, %d busy skips", &ticks, &runs, &skips); err != nil {
		t.Fatalf("summary %q: %v", got[start:], err)
	}
	if reports := strings.Count(got, ": report for "); runs != reports || ticks != runs || runs < 3 {
		t.Errorf("summary says %d ticks, %d runs; the output shows %d runs", ticks, runs, reports)
	}
}
