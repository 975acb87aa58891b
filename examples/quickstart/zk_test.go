package main

import (
	"os"
	"testing"

	"github.com/dislock/dislock/internal/zktest"
)

// TestQuickstartZooKeeper runs the quick start on ZooKeeper: DISLOCK_TEST_ZK
// when set, otherwise a private standalone server (stopped by PID when the
// test ends). Under CI a missing ZooKeeper install fails the test.
func TestQuickstartZooKeeper(t *testing.T) {
	u := os.Getenv("DISLOCK_TEST_ZK")
	if u == "" {
		u = "zk://" + zktest.ForTest(t, false).Connect()
	}
	quickstartOn(t, "ZK_URL", u, "ZooKeeper")
}
