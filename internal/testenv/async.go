package testenv

import (
	"testing"
	"time"
)

// Result is what a call that Async started returned.
type Result[T any] struct {
	V   T
	Err error
}

// Async runs f in a goroutine of its own and returns the channel on which
// its result comes, once. The caller receives it before the test ends.
func Async[T any](f func() (T, error)) <-chan Result[T] {
	ch := make(chan Result[T], 1)
	go func() {
		v, err := f()
		ch <- Result[T]{v, err}
	}()
	return ch
}

// Receive returns what ch gives first, waiting d at most, and fails t with
// the message of format and args (as t.Fatalf) when nothing came by then.
func Receive[T any](t testing.TB, ch <-chan T, d time.Duration, format string, args ...any) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf(format, args...)
		panic("unreachable")
	}
}

// WaitFor polls cond every 10ms until it holds (true) or d has passed
// (false): for a state that no channel reports, such as a server's view.
func WaitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}
