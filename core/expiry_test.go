package core_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
)

// shortBackend wraps a memlock handle: its claims say the store keeps them
// for short less than the TTL (a lease shared with other sessions and
// refreshed before the claim), and it records the Slack of every claim and
// the time of every renewal.
type shortBackend struct {
	*memlock.Backend
	short time.Duration

	mu     sync.Mutex
	slacks []time.Duration
	renews []time.Time
}

func (b *shortBackend) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	b.mu.Lock()
	b.slacks = append(b.slacks, req.Slack)
	b.mu.Unlock()
	l, err := b.Backend.TryAcquire(ctx, req)
	if err == nil {
		l.ExpiresAt = l.ExpiresAt.Add(-b.short)
	}
	return l, err
}

func (b *shortBackend) Renew(ctx context.Context, reqs []core.RenewRequest) ([]error, error) {
	b.mu.Lock()
	b.renews = append(b.renews, time.Now())
	b.mu.Unlock()
	return b.Backend.Renew(ctx, reqs)
}

// A claim that the store keeps for less than the TTL (Lease.ExpiresAt
// earlier than AcquiredAt + TTL) moves the session's renew deadline and
// its first renewal forward by as much; the renewals after it count from
// their own send as usual. The engine allows half a renew interval of
// slack; slot claims get none.
func TestShortLeaseMovesDeadlineForward(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 30 * time.Second // renew interval 10 s, renew deadline 20 s
		for _, short := range []time.Duration{0, 4 * time.Second} {
			sb := &shortBackend{Backend: memlock.NewStore().Backend(), short: short}
			l := newClient(t, sb, core.WithDefaults(core.TTL(ttl)))
			start := time.Now()
			s := hold(t, l, "k")
			if want := start.Add(20*time.Second - short); !s.Deadline().Equal(want) {
				t.Fatalf("short %v: deadline %v after the claim, want %v", short, s.Deadline().Sub(start), want.Sub(start))
			}
			time.Sleep(20*time.Second - short - time.Millisecond)
			synctest.Wait()
			if s.Err() != nil {
				t.Fatalf("short %v: session ended: %v", short, s.Err())
			}
			sb.mu.Lock()
			renews, slacks := sb.renews, sb.slacks
			sb.mu.Unlock()
			if len(slacks) != 1 || slacks[0] != 5*time.Second {
				t.Fatalf("short %v: claims sent with slack %v, want one with half the renew interval (5s)", short, slacks)
			}
			if len(renews) == 0 || renews[0].Sub(start) != 10*time.Second-short {
				t.Fatalf("short %v: renewals at %v, want the first %v after the claim", short, renews, 10*time.Second-short)
			}
			if want := renews[len(renews)-1].Add(20 * time.Second); !s.Deadline().Equal(want) {
				t.Fatalf("short %v: deadline after renewal %v, want the renewal's send + 20s", short, s.Deadline().Sub(start))
			}
			if err := s.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
			l.Close()
		}
	})
}

// A claim whose lease says the store keeps it for less than the renew
// margin (TTL − renew deadline) is over on arrival: the engine undoes it
// and does not hand out the session.
func TestLeaseShorterThanMarginRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memlock.NewStore()
		sb := &shortBackend{Backend: st.Backend(), short: 25 * time.Second}
		l := newClient(t, sb, core.WithDefaults(core.TTL(30*time.Second)))
		if s, err := l.TryAcquire(context.Background(), "k"); err == nil {
			s.Release(context.Background())
			t.Fatal("a claim kept for 5 s of a 30 s TTL was handed out")
		}
		synctest.Wait()
		// The undo freed the key.
		hold(t, newClient(t, st.Backend()), "k").Release(context.Background())
	})
}
