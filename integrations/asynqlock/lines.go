package asynqlock

import (
	"sync"
	"time"

	"github.com/dislock/dislock/core"
)

// quickWindow is how long after the key last changed hands HandOff still
// sends bounces back quickly: a key held longer has long-running holders,
// its waiters are next anyway, and a bounce comes back after BusyDelay
// instead.
const quickWindow = time.Second

// lines keeps, per key, the tasks waiting for it on this server and the
// budget of quick retries.
type lines struct {
	mu      sync.Mutex
	keys    map[string]*line
	waiting int // across keys
	swept   time.Time
}

type line struct {
	waiting int       // tasks waiting for the key
	moved   time.Time // when the key last changed hands, as far as seen here
	holder  holder    // the holder in the last busy answer
	newest  uint64    // a semaphore's newest permit token seen in busy answers
	// Quick retries are a token bucket kept as the time at which it is
	// full again (GCRA): each retry moves it on by 1s/rate.
	full time.Time
}

// holder identifies one acquisition of a key.
type holder struct {
	token      uint64
	owner      string
	acquiredAt int64 // Unix nanoseconds on the store's clock
}

// enter says whether a busy task of key waits (fewer than n wait for key and
// fewer than total, if not 0, for any key; it then counts as waiting until
// leave) and, if not, whether its bounce is a quick retry: at most rate a
// second, in bursts of up to rate/4, and only while the key changed hands
// (a new holder in the busy answer, or a waiter here that took its place in
// line) within quickWindow.
func (ls *lines) enter(key string, n, total, rate int, info *core.Info, now time.Time) (wait, quick bool) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if now.Sub(ls.swept) > time.Second {
		ls.sweep(now)
	}
	l := ls.keys[key]
	if l == nil {
		l = &line{}
		ls.keys[key] = l
	}
	switch {
	case info == nil:
		// The store does not say who holds the key: count every busy
		// answer as a change of hands, so that only the rate bounds the
		// quick retries.
		l.moved = now
	case info.Limit > 1 && info.Token != 0:
		// A full semaphore names the permit that expires first, which
		// changes as its holders renew. A permit changed hands when one
		// with a newer token shows up: tokens increase per key across
		// permits.
		if info.Token > l.newest {
			l.newest, l.moved = info.Token, now
		}
	default:
		if h := (holder{info.Token, info.Owner, info.AcquiredAt.UnixNano()}); h != l.holder {
			l.holder, l.moved = h, now
		}
	}
	if l.waiting < n && (total == 0 || ls.waiting < total) {
		l.waiting++
		ls.waiting++
		l.moved = now
		return true, false
	}
	if rate == 0 || now.Sub(l.moved) > quickWindow {
		return false, false
	}
	step := time.Second / time.Duration(rate)
	burst := time.Duration(max(1, rate/4)) * step
	if l.full.Before(now) {
		l.full = now
	}
	if l.full.Sub(now)+step > burst {
		return false, false
	}
	l.full = l.full.Add(step)
	return false, true
}

// leave ends a wait that enter started.
func (ls *lines) leave(key string) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if l := ls.keys[key]; l != nil {
		l.waiting--
		ls.waiting--
	}
}

// sweep drops the keys nobody waits for whose bucket is full again.
func (ls *lines) sweep(now time.Time) {
	ls.swept = now
	for k, l := range ls.keys {
		if l.waiting == 0 && !l.full.After(now) && now.Sub(l.moved) > quickWindow {
			delete(ls.keys, k)
		}
	}
}
