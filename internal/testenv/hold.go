package testenv

import (
	"context"
	"testing"

	"github.com/dislock/dislock/core"
)

// Hold takes key on l at once (TryAcquire with ctx), failing t if it
// cannot: a key the test goes on to hold.
func Hold(t testing.TB, ctx context.Context, l core.Locker, key string, opts ...core.Option) core.Session {
	t.Helper()
	s, err := l.TryAcquire(ctx, key, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
