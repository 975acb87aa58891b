package main

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/examples/internal/exenv"
)

func TestQuickstart(t *testing.T) {
	for _, v := range exenv.Variables {
		t.Setenv(v, "")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"backend: memlock",
		"worker-a: acquired, fencing token 1",
		"worker-b: busy, held by worker-a",
		"worker-a: releasing",
		"worker-b: acquired after waiting, fencing token 2",
		"done",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// quickstartOn runs the quick start with only env set (to url) of the
// backend variables and checks that it ran on backend, that worker-b found
// the lock busy, then held by worker-a, and that the fencing tokens
// increased from worker-a to worker-b.
func quickstartOn(t *testing.T, env, url, backend string) {
	t.Helper()
	for _, v := range exenv.Variables {
		t.Setenv(v, "")
	}
	t.Setenv(env, url)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"backend: " + backend, "worker-b: busy, held by worker-a", "done"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	first := regexp.MustCompile(`worker-a: acquired, fencing token (\d+)`).FindStringSubmatch(out.String())
	second := regexp.MustCompile(`worker-b: acquired after waiting, fencing token (\d+)`).FindStringSubmatch(out.String())
	if first == nil || second == nil {
		t.Fatalf("no fencing tokens in:\n%s", out.String())
	}
	a, _ := strconv.Atoi(first[1])
	b, _ := strconv.Atoi(second[1])
	if b <= a {
		t.Errorf("tokens %d then %d: not increasing", a, b)
	}
}
