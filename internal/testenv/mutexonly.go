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
	return Client(t, MutexOnly{memlock.NewStore().Backend()})
}
