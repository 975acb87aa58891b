package locktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

func testTokens(t *testing.T, e *env) {
	if e.h.NoFencing {
		t.Skip("backend has no fencing tokens (NoFencing)")
	}
	const rule = "fencing tokens strictly increase across releases and expiries, and renewals keep them"
	a, b := e.proc(t), e.proc(t)
	k := e.key(t)
	var last uint64
	check := func(s core.Session) {
		t.Helper()
		if s.Token() <= last {
			t.Fatalf("rule %q: token %d after %d", rule, s.Token(), last)
		}
		last = s.Token()
	}
	for i := 0; i < 4; i++ {
		p := a
		if i%2 == 1 {
			p = b
		}
		s := mustAcquire(t, p, k)
		check(s)
		s.Release(context.Background())
	}
	// Expiry: a is cut off, b takes over after the TTL.
	s := mustAcquire(t, a, k)
	check(s)
	a.fault.down.Store(true)
	s2, err := b.l.Acquire(ctxT(t, 10*e.ttl+5*time.Second), k)
	if err != nil {
		t.Fatal(err)
	}
	check(s2)
	tok := s2.Token()
	time.Sleep(e.ttl) // several renewals happen (not an assertion by itself)
	if s2.Token() != tok || s2.Err() != nil {
		t.Fatalf("rule %q: token changed on renewal or session lost: %v", rule, s2.Err())
	}
	s2.Release(context.Background())
	a.fault.down.Store(false)
	s3 := mustAcquire(t, a, k)
	check(s3)
	s3.Release(context.Background())
}

func testReconcile(t *testing.T, e *env) {
	const rule = "an acquire whose reply is lost is reconciled: nothing stays held until the TTL"
	a, b := e.proc(t), e.proc(t)
	k := e.key(t)
	a.fault.loseReply.Store(true)
	_, err := a.l.TryAcquire(ctxT(t, 10*time.Second), k, core.TTL(60*time.Second))
	a.fault.loseReply.Store(false)
	if err == nil || errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("rule %q: want a backend error, got %v", rule, err)
	}
	if !errors.Is(err, errReplyLost) {
		t.Errorf("rule %q: the cause is not kept: %v", rule, err)
	}
	s := mustAcquire(t, b, k) // would be busy for 60s if orphaned
	s.Release(context.Background())
}

func testUndoRetried(t *testing.T, e *env) {
	const rule = "the undo of an ambiguous acquire that fails is retried until it succeeds: nothing stays held until the TTL"
	a, b := e.proc(t), e.proc(t)
	k := e.key(t)
	a.fault.loseReply.Store(true)
	a.fault.failRelease.Store(true) // the undo sent at once fails too
	_, err := a.l.TryAcquire(ctxT(t, 10*time.Second), k, core.TTL(60*time.Second))
	a.fault.loseReply.Store(false)
	if err == nil || errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("rule %q: want a backend error, got %v", rule, err)
	}
	mustBusy(t, "the claim whose reply was lost is held until its undo succeeds", b, k)
	a.fault.failRelease.Store(false)
	start := time.Now()
	s, err := b.l.Acquire(ctxT(t, 15*time.Second), k, core.Backoff(10*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		t.Fatalf("rule %q: the orphaned claim was not undone: %v", rule, err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("rule %q: undone only after %v", rule, d)
	}
	s.Release(context.Background())
}
