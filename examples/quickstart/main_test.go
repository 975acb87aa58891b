package main

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/dislock/dislock/etcdlock/etcdtest"
	"github.com/dislock/dislock/examples/internal/extest"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/internal/zktest"
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

// TestQuickstartMySQL runs the quick start on the MySQL / MariaDB of
// DISLOCK_TEST_MYSQL, in its default lock table.
func TestQuickstartMySQL(t *testing.T) {
	quickstartOn(t, "MYSQL_URL", testenv.MySQL(t), "MySQL")
}

// TestQuickstartEtcd runs the quick start on etcd: DISLOCK_TEST_ETCD when
// set, otherwise a private embedded server.
func TestQuickstartEtcd(t *testing.T) {
	quickstartOn(t, "ETCD_URL", etcdtest.URL(t), "etcd")
}

// TestQuickstartZooKeeper runs the quick start on ZooKeeper: DISLOCK_TEST_ZK
// when set, otherwise a private standalone server (stopped by PID when the
// test ends). Under CI a missing ZooKeeper install fails the test.
func TestQuickstartZooKeeper(t *testing.T) {
	quickstartOn(t, "ZK_URL", zktest.URL(t, false), "ZooKeeper")
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
