package testenv

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
