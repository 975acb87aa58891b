package main

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/internal/zktest"
)

// TestQuickstartZooKeeper runs the quick start on ZooKeeper: DISLOCK_TEST_ZK
// when set, otherwise a private standalone server (stopped by PID when the
// test ends). Under CI a missing ZooKeeper install fails the test.
func TestQuickstartZooKeeper(t *testing.T) {
	u := os.Getenv("DISLOCK_TEST_ZK")
	if u == "" {
		if err := zktest.Installed(); err != nil {
			if v := strings.ToLower(os.Getenv("CI")); v == "true" || v == "1" {
				t.Fatal(err)
			}
			t.Skip(err)
		}
		e, err := zktest.Start(t.TempDir(), 1, 60*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Stop)
		u = "zk://" + e.Connect()
	}
	t.Setenv("DATABASE_URL", "")
	t.Setenv("REDIS_URL", "")
	t.Setenv("ETCD_URL", "")
	t.Setenv("ZK_URL", u)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"backend: ZooKeeper", "worker-b: busy, held by worker-a", "done"} {
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
