package locktest

import (
	"context"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

func testAdmin(t *testing.T, e *env) {
	skipIf(t, e.h.NoAdmin, "backend has no Admin (NoAdmin)")
	const rule = "Admin inspects, lists by prefix and force-releases; the victim learns of it at its next renewal"
	a, b, k := e.pair(t)
	adm, ok := b.l.(core.Admin)
	skipIf(t, !ok, "the Locker under test does not expose Admin")
	ctx := ctxT(t, 10*time.Second)
	if _, held, err := adm.Inspect(ctx, k); err != nil || held {
		t.Fatalf("rule %q: Inspect free key: held=%v err=%v", rule, held, err)
	}
	s1 := mustAcquire(t, a, k+"/1", core.WithOwner("owner-1"))
	s2 := mustAcquire(t, a, k+"/2", core.WithOwner("owner-2"))
	other := mustAcquire(t, a, e.prefix+"zz-other")
	defer other.Release(context.Background())
	info, held, err := adm.Inspect(ctx, k+"/1")
	if err != nil || !held || info.Owner != "owner-1" || info.Key != k+"/1" {
		t.Fatalf("rule %q: Inspect = %+v %v %v", rule, info, held, err)
	}
	if !e.h.NoFencing && info.Token != s1.Token() {
		t.Errorf("rule %q: Inspect token %d, session %d", rule, info.Token, s1.Token())
	}
	if info.ExpiresAt.IsZero() || (!info.AcquiredAt.IsZero() && !info.ExpiresAt.After(info.AcquiredAt)) {
		t.Errorf("rule %q: Inspect times %+v", rule, info)
	}
	list, err := adm.List(ctx, k+"/")
	if err != nil || len(list) != 2 {
		t.Fatalf("rule %q: List = %+v %v", rule, list, err)
	}
	seen := map[string]bool{}
	for _, i := range list {
		seen[i.Key] = true
	}
	if !seen[k+"/1"] || !seen[k+"/2"] {
		t.Fatalf("rule %q: List = %+v", rule, list)
	}
	released, err := adm.ForceRelease(ctx, k+"/1")
	if err != nil || !released {
		t.Fatalf("rule %q: ForceRelease = %v %v", rule, released, err)
	}
	expectLost(t, rule, s1, e.ttl+2*time.Second)
	if released, err := adm.ForceRelease(ctx, k+"/1"); err != nil || released {
		t.Fatalf("rule %q: ForceRelease of a free key = %v %v", rule, released, err)
	}
	s2.Release(context.Background())
}
