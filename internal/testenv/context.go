package testenv

import (
	"context"
	"testing"
	"time"
)

// Context returns a context that ends after d, or when t ends.
func Context(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
