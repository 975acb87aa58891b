package core

import (
	"errors"
	"time"
)

// addWaiter registers interest in releases of key before the first attempt,
// so that a release between an attempt and the wait is not missed.
func (c *Client) addWaiter(key string) chan struct{} {
	ch := make(chan struct{}, 1)
	c.mu.Lock()
	defer c.mu.Unlock()
	set := c.waiters[key]
	if set == nil {
		set = make(map[chan struct{}]struct{})
		c.waiters[key] = set
	}
	set[ch] = struct{}{}
	if c.watcher != nil && !c.watching && !c.closed {
		c.watching = true
		c.wg.Add(1)
		go c.watchLoop()
	}
	return ch
}

func (c *Client) removeWaiter(key string, ch chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	set := c.waiters[key]
	delete(set, ch)
	if len(set) == 0 {
		delete(c.waiters, key)
	}
}

// notify wakes this client's waiters on key.
func (c *Client) notify(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for ch := range c.waiters[key] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// wakeAll wakes every waiter (after a watch (re)connects, a release may have
// been missed).
func (c *Client) wakeAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, set := range c.waiters {
		for ch := range set {
			select {
			case ch <- struct{}{}:
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
		err := c.watcher.Watch(c.ctx, c.wakeAll, c.notify)
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
