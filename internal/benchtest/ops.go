package benchtest

import (
	"context"

	"github.com/dislock/dislock/core"
)

// AcquireRelease is the operation the uncontended benchmarks time: one
// TryAcquire of key on l and the Release of its session.
func AcquireRelease(l core.Locker, key string) func() error {
	return func() error {
		ctx := context.Background()
		s, err := l.TryAcquire(ctx, key)
		if err != nil {
			return err
		}
		return s.Release(ctx)
	}
}
