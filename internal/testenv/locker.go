package testenv

import (
	"context"
	"testing"
	"time"

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

// AcquireReleased releases held after delay, as its holder would, and
// returns the session that l's Acquire of the same key (with ctx, bounded by
// d) then gets, failing t if it gets none.
func AcquireReleased(t testing.TB, ctx context.Context, l core.Locker, held core.Session, delay, d time.Duration, opts ...core.Option) core.Session {
	t.Helper()
	go func() { time.Sleep(delay); held.Release(ctx) }()
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	s, err := l.Acquire(wctx, held.Key(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Client returns a core.Client on b, closed when t ends.
func Client(t testing.TB, b core.Backend, opts ...core.ClientOption) *core.Client {
	t.Helper()
	c, err := core.New(b, opts...)
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// AcquireAsync starts l's Acquire of key in a goroutine of its own and
// releases the session at once. Its result comes once on the channel
// returned: when the Acquire returned (V), and the error of the Acquire or
// of the Release that followed it (Err).
func AcquireAsync(ctx context.Context, l core.Locker, key string, opts ...core.Option) <-chan Result[time.Time] {
	return Async(func() (time.Time, error) {
		s, err := l.Acquire(ctx, key, opts...)
		at := time.Now()
		if err != nil {
			return at, err
		}
		return at, s.Release(ctx)
	})
}
