package mysqllock_test

import (
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

// Rule: ended rows do not pile up. A Backend's first release, and then a
// release at most every minute, deletes the ended rows (nobody live in
// line) whose last token is more than a day old; it keeps every other row,
// and a claim of a pruned key gets a token above the pruned one.
func TestPruneEndedRows(t *testing.T) {
	admin, table := adminAndTable(t)
	b := newBackend(t, table)
	ctx := ctxT(t)
	q := "`" + table + "`"
	const old = int64(25 * time.Hour / time.Microsecond)
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := admin.ExecContext(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	age := func(key string) { exec("UPDATE "+q+" SET token = token - ? WHERE `key` = ?", old, key) }
	mk := func(key string, held bool) core.AcquireRequest {
		t.Helper()
		r := core.AcquireRequest{Key: key, Owner: "o", OwnerToken: "tok-" + key, TTL: time.Minute}
		if _, err := b.TryAcquire(ctx, r); err != nil {
			t.Fatal(err)
		}
		if !held {
			if err := b.Release(ctx, core.ReleaseRequest{Key: key, OwnerToken: r.OwnerToken}); err != nil {
				t.Fatal(err)
			}
		}
		return r
	}
	mk("old-ended", false)
	age("old-ended")
	mk("new-ended", false)
	mk("old-live", true)
	age("old-live")
	h := mk("old-waiter", true)
	if _, err := b.TryAcquire(ctx, core.AcquireRequest{Key: "old-waiter", Owner: "o", OwnerToken: "w", TTL: time.Minute,
		Waiter: "w", WaiterTTL: time.Minute}); err == nil {
		t.Fatal("the waiter's try was granted on a held key")
	}
	if err := b.Release(ctx, core.ReleaseRequest{Key: "old-waiter", OwnerToken: h.OwnerToken}); err != nil {
		t.Fatal(err)
	}
	age("old-waiter")
	var oldToken uint64
	if err := admin.QueryRowContext(ctx, "SELECT token FROM "+q+" WHERE `key` = 'old-ended'").Scan(&oldToken); err != nil {
		t.Fatal(err)
	}
	keys := func() string {
		t.Helper()
		rows, err := admin.QueryContext(ctx, "SELECT `key` FROM "+q+" WHERE `key` <> 'trigger' ORDER BY 1")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var ks []string
		for rows.Next() {
			var k string
			if err := rows.Scan(&k); err != nil {
				t.Fatal(err)
			}
			ks = append(ks, k)
		}
		return strings.Join(ks, ",")
	}
	if got, want := keys(), "new-ended,old-ended,old-live,old-waiter"; got != want {
		t.Fatalf("rows before the prune: %s, want %s", got, want)
	}
	fresh := newBackend(t, table)
	trigger := core.AcquireRequest{Key: "trigger", Owner: "o", OwnerToken: "t", TTL: time.Minute}
	release := func() {
		t.Helper()
		if _, err := fresh.TryAcquire(ctx, trigger); err != nil {
			t.Fatal(err)
		}
		if err := fresh.Release(ctx, core.ReleaseRequest{Key: "trigger", OwnerToken: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	release()
	if got, want := keys(), "new-ended,old-live,old-waiter"; got != want {
		t.Fatalf("rows after the first release's prune: %s, want %s", got, want)
	}
	l, err := b.TryAcquire(ctx, core.AcquireRequest{Key: "old-ended", Owner: "o", OwnerToken: "again", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if l.Token <= oldToken {
		t.Errorf("a claim of a pruned key got token %d, not above the pruned %d", l.Token, oldToken)
	}
	if err := b.Release(ctx, core.ReleaseRequest{Key: "old-ended", OwnerToken: "again"}); err != nil {
		t.Fatal(err)
	}
	age("old-ended")
	release() // within the minute: no prune
	if got, want := keys(), "new-ended,old-ended,old-live,old-waiter"; got != want {
		t.Fatalf("rows after a second release: %s, want %s", got, want)
	}
}
