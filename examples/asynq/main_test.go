package main

import (
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/dislock/dislock/examples/internal/extest"
)

func TestRun(t *testing.T) {
	defer goleak.VerifyNone(t)
	got := extest.Run(t, "", "", run) // REDIS_URL unset: the embedded default
	extest.Contains(t, got, "embedded miniredis", "enqueued 4 tasks", "all 4 tasks done, one at a time")
	if n := strings.Count(got, ": done task "); n != 4 {
		t.Errorf("%d tasks done, want 4:\n%s", n, got)
	}
}
