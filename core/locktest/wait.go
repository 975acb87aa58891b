package locktest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

// Helpers of the rules about waits: a wait's result, and whether a
// notification woke it (the Observer's Wake), for acquire.go, semaphore.go
// and queue*.go.

// waitResult is the outcome of a wait started in the background: its
// session, its error and when it returned.
type waitResult struct {
	s   core.Session
	err error
	at  time.Time
}

// acquired waits for the result of a wait on res, up to limit, and returns
// it: the wait acquired. A failed wait fails t; one with no result within
// limit fails t with late.
func acquired(t *testing.T, rule string, res <-chan waitResult, limit time.Duration, late string) waitResult {
	t.Helper()
	select {
	case r := <-res:
		if r.err != nil {
			t.Fatalf("rule %q: %v", rule, r.err)
		}
		return r
	case <-time.After(limit):
		t.Fatalf("rule %q: %s", rule, late)
		return waitResult{}
	}
}

// acquiredAt is acquired with the session released: it returns when the
// wait acquired.
func acquiredAt(t *testing.T, rule string, res <-chan waitResult, limit time.Duration, late string) time.Time {
	t.Helper()
	r := acquired(t, rule, res, limit, late)
	r.s.Release(context.Background())
	return r.at
}

// acquireLog is an Observer that keeps the end of every acquisition.
type acquireLog struct {
	core.NopObserver
	mu   sync.Mutex
	ends []core.AcquireEndEvent
}

func (l *acquireLog) AcquireEnd(_ context.Context, e core.AcquireEndEvent) {
	l.mu.Lock()
	l.ends = append(l.ends, e)
	l.mu.Unlock()
}

// lastAcquired returns the end of the latest successful acquisition.
func (l *acquireLog) lastAcquired() (core.AcquireEndEvent, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.ends) - 1; i >= 0; i-- {
		if l.ends[i].Session != nil {
			return l.ends[i], true
		}
	}
	return core.AcquireEndEvent{}, false
}

// subscribe makes b's release subscription come up: a first wait on a
// busy key starts it.
func subscribe(t *testing.T, rule string, a, b *proc, key string) {
	t.Helper()
	warm := mustAcquire(t, a, key)
	wctx, wcancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	b.l.Acquire(wctx, key)
	wcancel()
	warm.Release(context.Background())
	if !waitFor(t, b.fault.watching.Load, 10*time.Second) {
		t.Fatalf("rule %q: the backend's Watch never called ready", rule)
	}
}

// waitNotified starts acquire (a wait of b with a long poll backoff) and
// checks that release, called once the wait was answered busy, wakes it
// (expectWokenAfterBusy).
func waitNotified(t *testing.T, rule string, b *proc, log *acquireLog, release func(), acquire func(context.Context) (core.Session, error)) {
	t.Helper()
	got := make(chan waitResult, 1)
	start := time.Now()
	go func() {
		s, err := acquire(ctxT(t, 30*time.Second))
		got <- waitResult{s, err, time.Now()}
	}()
	expectWokenAfterBusy(t, rule, "the release", b, start, log, got, release)
}

// expectWokenAfterBusy waits until an attempt of p's wait, whose result
// comes on res, was answered busy at or after since, then calls act and
// checks that the wait acquires within 2s of it, woken by a notification:
// right after a busy answer the wait's next poll is far off — its long
// backoff, or on a Queuer the refresh of its place in line a third of the
// queue TTL later — so only act's notification explains a prompt wake, and
// the Observer's Wake (log) must say so. The session is released.
func expectWokenAfterBusy(t *testing.T, rule, what string, p *proc, since time.Time, log *acquireLog, res <-chan waitResult, act func()) {
	t.Helper()
	if !waitFor(t, func() bool { return p.fault.busySince(since) }, 10*time.Second) {
		t.Fatalf("rule %q: the wait was not answered busy (it stopped trying)", rule)
	}
	at := time.Now()
	act()
	got := acquiredAt(t, rule, res, 15*time.Second, "the wait did not acquire within 15s of "+what+" (its next poll was further off)")
	if d := got.Sub(at); d > 2*time.Second {
		t.Errorf("rule %q: the wait acquired %v after %s", rule, d, what)
	}
	if end, ok := log.lastAcquired(); !ok || end.Wake != core.WakeNotify {
		t.Errorf("rule %q: the wait that acquired was woken by %q, want %q", rule, end.Wake, core.WakeNotify)
	}
}
