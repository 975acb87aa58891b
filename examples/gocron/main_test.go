package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestGocronExample(t *testing.T) {
	defer goleak.VerifyNone(t)
	t.Setenv("DATABASE_URL", "")
	t.Setenv("REDIS_URL", "")
	t.Setenv("ETCD_URL", "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	got := out.String()
	t.Log(got)
	for _, want := range []string{
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
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q", want)
		}
	}
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
