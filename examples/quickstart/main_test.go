package main

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/dislock/dislock/examples/internal/extest"
)

func TestQuickstart(t *testing.T) {
	extest.Contains(t, extest.Run(t, "", "", run),
		"backend: memlock",
		"worker-a: acquired, fencing token 1",
		"worker-b: busy, held by worker-a",
		"worker-a: releasing",
		"worker-b: acquired after waiting, fencing token 2",
		"done",
	)
}

// quickstartOn runs the quick start with only env set (to url) of the
// backend variables and checks that it ran on backend, that worker-b found
// the lock busy, then held by worker-a, and that the fencing tokens
// increased from worker-a to worker-b.
func quickstartOn(t *testing.T, env, url, backend string) {
	t.Helper()
	out := extest.Run(t, env, url, run)
	extest.Contains(t, out, "backend: "+backend, "worker-b: busy, held by worker-a", "done")
	first := regexp.MustCompile(`worker-a: acquired, fencing token (\d+)`).FindStringSubmatch(out)
	second := regexp.MustCompile(`worker-b: acquired after waiting, fencing token (\d+)`).FindStringSubmatch(out)
	if first == nil || second == nil {
		t.Fatalf("no fencing tokens in:\n%s", out)
	}
	a, _ := strconv.Atoi(first[1])
	b, _ := strconv.Atoi(second[1])
	if b <= a {
		t.Errorf("tokens %d then %d: not increasing", a, b)
	}
}
