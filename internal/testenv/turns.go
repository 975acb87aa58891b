package testenv

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

// Turn is one notification a Queuer's WatchTurns delivered.
type Turn struct{ Key, Waiter string }

// WatchTurns runs q.WatchTurns until stop is called or t ends, and returns
// the channel of the turns it delivers once the subscription is in place.
// It fails t when the subscription is not in place within 15 s, or ends
// before stop.
func WatchTurns(t testing.TB, q core.Queuer) (turns <-chan Turn, stop func()) {
	t.Helper()
	ch := make(chan Turn, 64)
	ready, done := make(chan struct{}), make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer close(done)
		var once sync.Once
		err := q.WatchTurns(ctx, func() { once.Do(func() { close(ready) }) }, func(key, waiter string) {
			ch <- Turn{key, waiter}
		})
		if ctx.Err() == nil {
			t.Errorf("WatchTurns: %v", err)
		}
	}()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	select {
	case <-ready:
	case <-done:
		t.Fatal("WatchTurns ended before it was ready")
	case <-time.After(15 * time.Second):
		t.Fatal("WatchTurns not ready within 15s")
	}
	return ch, stop
}
