package memlock_test

import (
	"context"
	"testing"

	"go.uber.org/goleak"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/locktest"
	"github.com/dislock/dislock/core/memlock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func harness(store *memlock.Store) locktest.Harness {
	return locktest.Harness{
		NewBackend: func(testing.TB) core.Backend { return store.Backend() },
		Steal: func(_ context.Context, key string) error {
			store.Steal(key)
			return nil
		},
		Delete: func(_ context.Context, key string) error {
			store.Delete(key)
			return nil
		},
	}
}

func TestConformance(t *testing.T) {
	t.Parallel() // each suite has its own keys; the suites mostly wait on timers
	locktest.Run(t, harness(memlock.NewStore()))
}

// passThrough is a decorator that adds nothing: the suite proves that
// wrapping a Locker this way is transparent.
type passThrough struct{ core.Locker }

func TestConformanceWrapped(t *testing.T) {
	t.Parallel() // each suite has its own keys; the suites mostly wait on timers
	h := harness(memlock.NewStore())
	h.Wrap = func(l core.Locker) core.Locker { return passThrough{l} }
	h.NoAdmin = true // the wrapper hides Admin, as decorators may
	locktest.Run(t, h)
}
