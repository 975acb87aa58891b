package benchtest

import (
	"context"
	"crypto/rand"
	"fmt"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

// MixedClaims takes, on b, the 40 leases whose batch renewal the backends
// count: 36 permits of nine semaphores of four, and four mutex leases, each
// of TTL ttl. It returns their renew requests, one batch.
func MixedClaims(tb testing.TB, ctx context.Context, b core.Backend, ttl time.Duration) []core.RenewRequest {
	tb.Helper()
	var reqs []core.RenewRequest
	for i := range 40 {
		limit := 4
		key := fmt.Sprintf("sem/%d", i/4)
		if i%10 == 9 {
			limit, key = 0, fmt.Sprintf("mutex/%d", i)
		}
		r := core.AcquireRequest{Key: key, Owner: "test", OwnerToken: rand.Text(), TTL: ttl, Limit: limit}
		if _, err := b.TryAcquire(ctx, r); err != nil {
			tb.Fatalf("%d: %v", i, err)
		}
		reqs = append(reqs, core.RenewRequest{Key: r.Key, OwnerToken: r.OwnerToken, TTL: r.TTL, Limit: limit})
	}
	return reqs
}

// RenewAll renews reqs on b in one call and fails tb unless every lease
// was renewed.
func RenewAll(tb testing.TB, ctx context.Context, b core.Backend, reqs []core.RenewRequest) {
	tb.Helper()
	results, err := b.Renew(ctx, reqs)
	if err != nil {
		tb.Fatal(err)
	}
	for i, r := range results {
		if r != nil {
			tb.Fatalf("renew %d: %v", i, r)
		}
	}
}
