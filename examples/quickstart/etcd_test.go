package main

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/etcdlock/etcdtest"
)

// TestQuickstartEtcd runs the quick start on etcd: DISLOCK_TEST_ETCD when
// set, otherwise a private embedded server.
func TestQuickstartEtcd(t *testing.T) {
	u := etcdtest.Shared(t)
	if u == "" {
		u = etcdtest.Start(t, 1).URL()
	}
	t.Setenv("DATABASE_URL", "")
	t.Setenv("REDIS_URL", "")
	t.Setenv("ZK_URL", "")
	t.Setenv("ETCD_URL", u)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"backend: etcd", "worker-b: busy, held by worker-a", "done"} {
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
