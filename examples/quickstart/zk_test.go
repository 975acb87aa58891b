package main

import (
	"os"
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
	quickstartOn(t, "ZK_URL", u, "ZooKeeper")
}
