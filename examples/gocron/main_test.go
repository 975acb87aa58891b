package main

import (
	"fmt"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/dislock/dislock/examples/internal/extest"
)

func TestGocronExample(t *testing.T) {
	defer goleak.VerifyNone(t)
	got := extest.Run(t, "", "", run)
	extest.Contains(t, got,
		"backend: memlock",
		"== elector: one leader runs every job ==",
		"elected leader (fencing token 1)",
		"heartbeat (token 1)",
		"the store says the leader is scheduler-",
		"it hands over at once",
		"elected leader (fencing token 2)",
		"took over after",
		"== locker: each tick runs on one scheduler ==",
		"report for",
		"each tick ran once: true",
	)
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
