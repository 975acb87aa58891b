package zktest

import (
	"os"
	"testing"
	"time"

	"github.com/dislock/dislock/internal/testenv"
)

// Need skips t when no ZooKeeper server can be started here, and fails it
// under CI (testenv.CI), where the install is part of the set-up.
func Need(t testing.TB) {
	t.Helper()
	if err := Installed(); err != nil {
		if testenv.CI() {
			t.Fatal(err)
		}
		t.Skip(err)
	}
}

// ForTest starts a private server for t, in its temporary directory, and
// stops it when t ends: one standalone server with this package's short
// tickTime, or with stock a stock server's (tickTime 2000). Where no server
// is installed it fails the test under CI (testenv.CI) and skips it
// elsewhere.
func ForTest(t testing.TB, stock bool) *Ensemble {
	t.Helper()
	Need(t)
	start := func(dir string, timeout time.Duration) (*Ensemble, error) { return Start(dir, 1, timeout) }
	if stock {
		start = StartStock
	}
	e, err := start(t.TempDir(), 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Stop)
	return e
}

// URL is the zk:// URL of the server t runs on: DISLOCK_TEST_ZK when it is
// set, otherwise a private server's (ForTest with stock).
func URL(t testing.TB, stock bool) string {
	t.Helper()
	if u := os.Getenv("DISLOCK_TEST_ZK"); u != "" {
		return u
	}
	return "zk://" + ForTest(t, stock).Connect()
}
