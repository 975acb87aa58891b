package mysqllock_test

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/mysqllock"
)

// Rule: plain claims and releases of free keys made while others are on
// their way share CALLs of the batch procedure, and each gets the answer
// its statement alone would have: every claim of a free key is won, with a
// token above the key's last, and every release ends its lease.
func TestStatementsThatMeetShareACall(t *testing.T) {
	table := freshTable(t)
	db := newDB(t)
	db.SetMaxOpenConns(8)
	ctx := ctxT(t)
	b, err := mysqllock.NewBackend(ctx, db, mysqllock.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const goroutines, pairs = 16, 30
	var wg sync.WaitGroup
	errs := make([]error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			key := fmt.Sprint("k", g)
			var last uint64
			for i := range pairs + 1 { // the first pair makes the row
				tok := fmt.Sprintf("t%d-%d", g, i)
				l, err := b.TryAcquire(ctx, core.AcquireRequest{Key: key, Owner: "o", OwnerToken: tok, TTL: time.Minute})
				if err != nil {
					errs[g] = fmt.Errorf("claim %d of %s: %w", i, key, err)
					return
				}
				if l.Token <= last {
					errs[g] = fmt.Errorf("claim %d of %s: token %d after %d", i, key, l.Token, last)
					return
				}
				last = l.Token
				if err := b.Release(ctx, core.ReleaseRequest{Key: key, OwnerToken: tok}); err != nil {
					errs[g] = fmt.Errorf("release %d of %s: %w", i, key, err)
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := mysqllock.LaneBatches(b); n == 0 {
		t.Errorf("%d goroutines made %d claims and releases at once, none in a batch", goroutines, 2*goroutines*pairs)
	}
	for g := range goroutines {
		if info, held, err := b.Inspect(ctx, fmt.Sprint("k", g)); err != nil || held {
			t.Fatalf("k%d after its last release: %+v %v %v, want free", g, info, held, err)
		}
	}
}

// Rule: the batch procedure answers each item as its statement alone
// would, in order; and a batch whose claims have waited for row locks
// longer than their bound is rolled back whole: it answers an empty string and changes
// nothing, so that each of its callers goes on to the procedure that
// decides.
func TestBatchProcedure(t *testing.T) {
	admin, table := adminAndTable(t)
	b := newBackend(t, table)
	ctx := ctxT(t)
	// Rows for "free", "locked" and "held" (held by "h").
	for _, k := range []string{"free", "locked", "held"} {
		if _, err := b.TryAcquire(ctx, core.AcquireRequest{Key: k, Owner: "o", OwnerToken: "make-" + k, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if k == "held" {
			continue
		}
		if err := b.Release(ctx, core.ReleaseRequest{Key: k, OwnerToken: "make-" + k}); err != nil {
			t.Fatal(err)
		}
	}
	item := func(release bool, key, holder string) string {
		if release {
			return fmt.Sprintf(`{"r":1,"k":%q,"h":%q}`, key, holder)
		}
		return fmt.Sprintf(`{"r":0,"k":%q,"o":"owner-%s","h":%q,"t":60000000}`, key, holder, holder)
	}
	batch := func(half time.Duration, items ...string) string {
		t.Helper()
		out, err := mysqllock.CallBatch(ctx, b, "["+strings.Join(items, ",")+"]", half)
		if err != nil {
			t.Fatalf("CALL batch: %v", err)
		}
		return out
	}

	// Past the bound: "locked" is locked by another transaction for
	// longer than the claims' bound (ten times as long, so that the CALL
	// still waits past the bound if it starts late on a busy machine).
	tx := lockRow(t, admin, table, "locked")
	unlock := time.AfterFunc(2*time.Second, func() { _ = tx.Rollback() })
	defer unlock.Stop()
	if out := batch(200*time.Millisecond, item(false, "free", "c1"), item(false, "locked", "c2")); out != "" {
		t.Errorf("batch whose claim waited past its bound: answer %q, want '' (rolled back)", out)
	}
	if info, held, err := b.Inspect(ctx, "free"); err != nil || held {
		t.Fatalf("free after a batch rolled back: %+v %v %v, want free", info, held, err)
	}

	// Within the bound: each item answered in order.
	out := batch(time.Second, item(false, "free", "c3"), item(true, "held", "nobody"), item(true, "held", "make-held"),
		item(false, "held", "c4"), item(true, "missing", "x"))
	parts := strings.Split(out, ",")
	if len(parts) != 6 || parts[5] != "" || parts[1] != "0:0" || parts[2] != "1:0" || parts[4] != "0:0" ||
		!strings.HasPrefix(parts[0], "1:") || !strings.HasPrefix(parts[3], "1:") {
		t.Fatalf("batch answer %q, want 1:<token>,0:0,1:0,1:<token>,0:0,", out)
	}
	for i, want := range map[int]struct{ key, owner string }{0: {"free", "owner-c3"}, 3: {"held", "owner-c4"}} {
		tok, err := strconv.ParseUint(strings.TrimPrefix(parts[i], "1:"), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		// The claim of "held" follows its release by its holder in the
		// same batch, as two statements alone would.
		info, held, err := b.Inspect(ctx, want.key)
		if err != nil || !held || info.Token != tok || info.Owner != want.owner {
			t.Fatalf("%s after its claim in a batch: %+v %v %v, want held by %s with token %d", want.key, info, held, err, want.owner, tok)
		}
	}
}
