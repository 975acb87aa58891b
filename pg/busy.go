package pg

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dislock/dislock/core"
)

// maxBusyHints bounds the keys a Backend remembers as held.
const maxBusyHints = 1 << 14

// busyHints remembers the keys a try found held by another owner, until
// the holder's lease was due to end (on this process's clock). A try (no
// waiter, no slot) on such a key first reads the row alone (probe): one
// statement that takes no lock, writes nothing and arms no timeout, which
// answers busy while the key stays held, as a hot key's tries mostly find
// it. Only when that read finds the key free, or the caller's own, does the
// acquire batch follow, one round trip more; the hint stays until its time,
// so that the tries racing for a hot key that just became free read first
// too, rather than all queuing for the row's lock. A hint is never an
// answer: the read decides. A try on a key not remembered sends the batch
// at once, as the uncontended acquire does.
type busyHints struct {
	m sync.Map // key -> time.Time, when the holder's lease was due to end
	n atomic.Int64
}

// held tells whether key was last seen held by a lease not yet due to end.
func (h *busyHints) held(key string) bool {
	v, ok := h.m.Load(key)
	if !ok {
		return false
	}
	if time.Now().Before(v.(time.Time)) {
		return true
	}
	h.forget(key)
	return false
}

// note remembers key, until the holder's lease is due to end, when err is
// a busy answer that names a live holder.
func (h *busyHints) note(key string, err error) {
	var busy *core.NotAcquiredError
	if !errors.As(err, &busy) || busy.Holder == nil || busy.Holder.Remaining <= 0 {
		return
	}
	until := time.Now().Add(busy.Holder.Remaining)
	if _, loaded := h.m.Swap(key, until); !loaded && h.n.Add(1) > maxBusyHints {
		h.sweep()
	}
}

func (h *busyHints) forget(key string) {
	if _, loaded := h.m.LoadAndDelete(key); loaded {
		h.n.Add(-1)
	}
}

// sweep drops the hints whose lease was due to end, and all of them when
// that leaves too many.
func (h *busyHints) sweep() {
	now := time.Now()
	h.m.Range(func(k, v any) bool {
		if !now.Before(v.(time.Time)) {
			h.forget(k.(string))
		}
		return true
	})
	if h.n.Load() > maxBusyHints {
		h.m.Range(func(k, _ any) bool {
			h.forget(k.(string))
			return true
		})
	}
}
