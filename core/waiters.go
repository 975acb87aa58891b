package core

import (
	"crypto/rand"
	"errors"
	"time"
)

// echoWindow is how long a release this client published itself is expected
// to come back through its own Watch subscription.
const echoWindow = 200 * time.Millisecond

// Waiters on a key are woken one at a time, oldest first: one release lets
// one waiter of this client try, not all of them.

// waiter is one waiting Acquire of this client.
type waiter struct {
	id string    // the wait's name in a Queuer store's queue ("" otherwise)
	ch chan Wake // a wake and its reason; buffered 1
}

// queueTTL is how long a Queuer store keeps a waiter's place in line after
// its latest attempt; a queued wait tries again at least every third of it.
const queueTTL = 2 * time.Second

// addWaiter registers interest in releases of key before the first attempt,
// so that a release between an attempt and the wait is not missed.
func (c *Client) addWaiter(key string) *waiter {
	w := &waiter{ch: make(chan Wake, 1)}
	if c.queuer != nil {
		w.id = rand.Text()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waiters[key] = append(c.waiters[key], w)
	if c.watcher != nil && !c.watching && !c.closed {
		c.watching = true
		c.wg.Add(1)
		go c.watchLoop()
	}
	return w
}

// removeWaiter unregisters w. A wake it received but did not use (it gave
// up, or acquired through another wake) passes to the next waiter — unless
// the store keeps the queue, which passes the turn itself (Leave).
func (c *Client) removeWaiter(key string, w *waiter, acquired bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	removeFirst(c.waiters, key, func(o *waiter) bool { return o == w })
	select {
	case <-w.ch:
		if !acquired && c.queuer == nil {
			c.wakeOneLocked(key)
		}
	default:
	}
}

// notify wakes one of this client's waiters on key after a release this
// client made. A Queuer store tells the waiter whose turn it is instead.
func (c *Client) notify(key string) {
	if c.queuer != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wakeOneLocked(key)
}

// maxEchoes bounds the echoes remembered per key: a store that drops
// notifications must not make them pile up within one echo window.
const maxEchoes = 8

// expectEcho remembers, before this client releases key, that the store's
// notification of that release will come back through Watch — only while a
// subscription is in place, so that nothing piles up when none is. It is
// recorded before the release is sent, so that an echo that arrives before
// the release's reply is still known as one. Echoes that did not come back
// within the echo window are swept out. It returns the record's time, for
// dropEcho; zero when nothing was recorded.
func (c *Client) expectEcho(key string) time.Time {
	if c.queuer != nil {
		return time.Time{} // turns are addressed: no echo to drop
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.subscribed {
		return time.Time{}
	}
	now := time.Now()
	if now.Sub(c.swept) > echoWindow {
		c.sweepEchoesLocked(now)
	}
	ts := c.echoes[key]
	if len(ts) >= maxEchoes {
		ts = ts[1:]
	}
	c.echoes[key] = append(ts, now)
	return now
}

// dropEcho forgets the echo recorded at at for a release that failed.
func (c *Client) dropEcho(key string, at time.Time) {
	if at.IsZero() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	removeFirst(c.echoes, key, at.Equal)
}

// sweepEchoesLocked drops the echoes older than the echo window.
func (c *Client) sweepEchoesLocked(now time.Time) {
	c.swept = now
	for key, ts := range c.echoes {
		for len(ts) > 0 && now.Sub(ts[0]) > echoWindow {
			ts = ts[1:]
		}
		if len(ts) == 0 {
			delete(c.echoes, key)
		} else {
			c.echoes[key] = ts
		}
	}
}

// isSubscribed reports whether the release subscription is in place.
func (c *Client) isSubscribed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.subscribed
}

// setSubscribed records whether the release subscription is in place; the
// echoes of a subscription that ended will never come back.
func (c *Client) setSubscribed(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.subscribed = on
	if !on {
		clear(c.echoes)
	}
}

// echoCount is the number of echoes remembered (for tests).
func (c *Client) echoCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, ts := range c.echoes {
		n += len(ts)
	}
	return n
}

// watched handles a release notification from the store: the echo of one
// of this client's own releases (already acted on) is dropped.
func (c *Client) watched(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ts := c.echoes[key]; len(ts) > 0 {
		now := time.Now()
		for len(ts) > 0 && now.Sub(ts[0]) > echoWindow {
			ts = ts[1:]
		}
		if len(ts) > 0 {
			ts = ts[1:]
			if len(ts) == 0 {
				delete(c.echoes, key)
			} else {
				c.echoes[key] = ts
			}
			return
		}
		delete(c.echoes, key)
	}
	c.wakeOneLocked(key)
}

// turn handles a Queuer store's turn: it wakes the wait named waiter, if it
// is this client's, or, when the store named none, the oldest wait on key.
func (c *Client) turn(key, waiter string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if waiter == "" {
		c.wakeOneLocked(key)
		return
	}
	for _, w := range c.waiters[key] {
		if w.id == waiter {
			select {
			case w.ch <- WakeNotify:
			default:
			}
			return
		}
	}
}

// wakeOneLocked wakes the oldest waiter on key that has no wake pending.
func (c *Client) wakeOneLocked(key string) {
	for _, w := range c.waiters[key] {
		select {
		case w.ch <- WakeNotify:
			return
		default: // already woken; try the next
		}
	}
}

// wakeAll wakes every waiter (after a watch (re)connects, a release may have
// been missed).
func (c *Client) wakeAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, list := range c.waiters {
		for _, w := range list {
			select {
			case w.ch <- WakePoll: // a re-check, as a poll is
			default:
			}
		}
	}
}

// watchLoop keeps the backend's release subscription open until Close,
// resubscribing with backoff after failures. While it is down, waiters poll.
func (c *Client) watchLoop() {
	defer c.wg.Done()
	for failures := 0; ; {
		start := time.Now()
		ready := func() { c.setSubscribed(true); c.wakeAll() }
		var err error
		if c.queuer != nil {
			err = c.queuer.WatchTurns(c.ctx, ready, c.turn)
		} else {
			err = c.watcher.Watch(c.ctx, ready, c.watched)
		}
		c.setSubscribed(false)
		if c.ctx.Err() != nil || errors.Is(err, ErrUnsupported) {
			return
		}
		if err != nil && time.Since(start) < time.Minute {
			failures++
		} else {
			failures = 0
		}
		if sleepCtx(c.ctx, backoffWait(100*time.Millisecond, 30*time.Second, failures)) != nil {
			return
		}
	}
}

// removeFirst removes the first element of m[key] that match accepts, and
// the key once its list is empty.
func removeFirst[T any](m map[string][]T, key string, match func(T) bool) {
	list := m[key]
	for i, v := range list {
		if match(v) {
			list = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(m, key)
	} else {
		m[key] = list
	}
}
