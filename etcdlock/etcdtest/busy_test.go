package etcdtest_test

import (
	"errors"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/etcdlock"
	"github.com/dislock/dislock/etcdlock/etcdtest"
	"github.com/dislock/dislock/internal/testenv"
)

// TestBusyTryIsARead checks that a claim of a key this backend last saw
// held is answered by a read: no Raft entry is applied for it, for a
// mutex and for a full semaphore. (A transaction that contains a put is a
// proposal even when its compare fails.)
func TestBusyTryIsARead(t *testing.T) {
	c := etcdtest.Start(t, 1)
	prefix := uniquePrefix("busyread")
	holder := newLocker(t, c.Client(t), prefix)
	b, err := etcdlock.NewBackend(c.Client(t), etcdlock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	for _, limit := range []int{1, 2} {
		key := "k" + string(rune('0'+limit))
		var opts []core.Option
		if limit > 1 {
			opts = append(opts, core.Limit(limit))
		}
		for range limit {
			s := testenv.Hold(t, testenv.Context(t, 5*time.Second), holder, key, opts...)
			defer s.Release(testenv.Context(t, 5*time.Second))
		}
		req := core.AcquireRequest{Key: key, Owner: "t", TTL: 5 * time.Second}
		if limit > 1 {
			req.Limit = limit
		}
		// The first try learns the key is busy; the next ones only read.
		for i := range 4 {
			before := c.Applied(0)
			req.OwnerToken = "tok" + string(rune('a'+i))
			_, err := b.TryAcquire(testenv.Context(t, 5*time.Second), req)
			if !errors.Is(err, core.ErrNotAcquired) {
				t.Fatalf("limit %d, try %d: %v, want busy", limit, i, err)
			}
			if d := c.Applied(0) - before; i > 0 && d != 0 {
				t.Errorf("limit %d, try %d: a busy try applied %d Raft entries, want 0", limit, i, d)
			}
		}
	}
}
