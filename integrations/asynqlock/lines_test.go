package asynqlock

import (
	"fmt"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

// TestLines_QuickBudget: on the store's clock of the test (synthetic
// times), quick retries come in bursts of rate/4 and then at rate a second,
// only while the key changes hands.
func TestLines_QuickBudget(t *testing.T) {
	ls := lines{keys: map[string]*line{}}
	t0 := time.Unix(1000, 0)
	info := &core.Info{Token: 1, Owner: "a"}
	if wait, _ := ls.enter("k", 1, 0, 40, info, t0); !wait {
		t.Fatal("first busy task does not wait")
	}
	quick := 0
	for range 20 {
		if wait, q := ls.enter("k", 1, 0, 40, info, t0); wait {
			t.Fatal("a second task waits: the line holds one")
		} else if q {
			quick++
		}
	}
	if quick != 10 {
		t.Errorf("%d quick retries at once, want a burst of 10 (rate 40/4)", quick)
	}
	// 100ms later the bucket has 4 more (40 a second).
	quick = 0
	for range 20 {
		if _, q := ls.enter("k", 1, 0, 40, info, t0.Add(100*time.Millisecond)); q {
			quick++
		}
	}
	if quick != 4 {
		t.Errorf("%d quick retries 100ms after the burst, want 4", quick)
	}
	// More than a second without a new holder: none, although the bucket
	// is full again.
	if _, q := ls.enter("k", 1, 0, 40, info, t0.Add(2*time.Second)); q {
		t.Error("quick retry while the key stood still for 2s")
	}
	// A new holder: quick again.
	if _, q := ls.enter("k", 1, 0, 40, &core.Info{Token: 2, Owner: "b"}, t0.Add(2*time.Second)); !q {
		t.Error("no quick retry after the key changed hands")
	}
	// Rate 0: never quick.
	if _, q := ls.enter("k", 1, 0, 0, &core.Info{Token: 3}, t0.Add(3*time.Second)); q {
		t.Error("quick retry with QuickRetries(0)")
	}
}

// TestLines_Sweep: keys nobody waits for are forgotten once their bucket is
// full again, so that the map does not grow with every key ever busy.
func TestLines_Sweep(t *testing.T) {
	ls := lines{keys: map[string]*line{}}
	t0 := time.Unix(1000, 0)
	for i := range 1000 {
		k := fmt.Sprint("k", i)
		ls.enter(k, 1, 0, 20, nil, t0)
		ls.enter(k, 1, 0, 20, nil, t0) // a quick retry
		ls.leave(k)
	}
	ls.enter("waiting", 1, 0, 20, nil, t0)
	ls.enter("new", 1, 0, 20, nil, t0.Add(3*time.Second))
	if len(ls.keys) != 2 {
		t.Errorf("%d keys kept after the sweep, want 2 (the one waited for, the new one)", len(ls.keys))
	}
	if ls.keys["waiting"] == nil || ls.keys["waiting"].waiting != 1 {
		t.Error("the sweep dropped a key with a waiter")
	}
}

// TestLines_MaxWaiting: a bound across keys stops a new line from forming,
// and a wait that ends makes room again.
func TestLines_MaxWaiting(t *testing.T) {
	ls := lines{keys: map[string]*line{}}
	t0 := time.Unix(1000, 0)
	for _, k := range []string{"a", "b"} {
		if wait, _ := ls.enter(k, 1, 2, 20, nil, t0); !wait {
			t.Fatalf("key %s: no wait under the bound", k)
		}
	}
	if wait, _ := ls.enter("c", 1, 2, 20, nil, t0); wait {
		t.Fatal("key c waits although 2 tasks wait, the bound")
	}
	ls.leave("a")
	if wait, _ := ls.enter("c", 1, 2, 20, nil, t0); !wait {
		t.Fatal("key c does not wait after a wait ended")
	}
}

// TestLines_SemaphoreHolders: a full semaphore's busy answer names the
// permit that expires first, which rotates among long-running holders as
// they renew: that is not a change of hands, and does not reopen quick
// retries; a permit with a newer token is.
func TestLines_SemaphoreHolders(t *testing.T) {
	ls := lines{keys: map[string]*line{}}
	t0 := time.Unix(1000, 0)
	permit := func(token uint64, owner string) *core.Info {
		return &core.Info{Token: token, Owner: owner, Limit: 3}
	}
	ls.enter("k", 1, 0, 40, permit(7, "a"), t0) // waits
	if _, q := ls.enter("k", 1, 0, 40, permit(5, "b"), t0); !q {
		t.Fatal("no quick retry right after the first busy answer")
	}
	// Two seconds on, the permits of a, b and c take turns expiring first.
	t1 := t0.Add(2 * time.Second)
	for i, p := range []*core.Info{permit(5, "b"), permit(6, "c"), permit(7, "a")} {
		if _, q := ls.enter("k", 1, 0, 40, p, t1); q {
			t.Errorf("busy answer %d (an older permit, token %d): quick retry, want none", i, p.Token)
		}
	}
	if _, q := ls.enter("k", 1, 0, 40, permit(8, "d"), t1); !q {
		t.Error("no quick retry after a new permit (token 8) showed up")
	}
}
