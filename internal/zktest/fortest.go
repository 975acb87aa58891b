package zktest

import (
	"testing"
	"time"

	"github.com/dislock/dislock/internal/testenv"
)

// Need skips t when no ZooKeeper server can be started here, and fails it
// under CI, where the install is part of the set-up.
func Need(t testing.TB) {
	t.Helper()
	if err := Installed(); err != nil {
		if testenv.CI() {
			t.Fatal(err)
		}
		t.Skip(err)
	}
}

// StartForTest starts an ensemble of n nodes (1: a standalone server) in a
// temporary directory of t, within a minute, and stops it by PID when t
// ends. A missing install skips t (see Need).
func StartForTest(t testing.TB, n int) *Ensemble {
	t.Helper()
	Need(t)
	e, err := Start(t.TempDir(), n, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Stop)
	return e
}
