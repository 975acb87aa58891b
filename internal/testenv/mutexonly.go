package testenv

import (
	"testing"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
)

// MutexOnly hides every optional interface of a backend: a store without
// semaphores.
type MutexOnly struct{ core.Backend }

// MutexOnlyLocker returns a Locker on a fresh in-memory store behind
// MutexOnly, closed when t ends.
func MutexOnlyLocker(t testing.TB) *core.Client {
	t.Helper()
	c, err := core.New(MutexOnly{memlock.NewStore().Backend()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
