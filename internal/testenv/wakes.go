package testenv

import (
	"context"
	"sync"

	"github.com/dislock/dislock/core"
)

// Wakes is an Observer that keeps, by key, the Wake of the latest
// acquisition that acquired. Its zero value is ready to use.
type Wakes struct {
	core.NopObserver
	mu  sync.Mutex
	end map[string]core.Wake
}

// AcquireEnd keeps e's Wake when e acquired.
func (w *Wakes) AcquireEnd(_ context.Context, e core.AcquireEndEvent) {
	if e.Session == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.end == nil {
		w.end = map[string]core.Wake{}
	}
	w.end[e.Key] = e.Wake
}

// Of returns the Wake of the latest acquisition of key that acquired, ""
// when none did.
func (w *Wakes) Of(key string) core.Wake {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.end[key]
}
