package pg_test

import (
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/pg"
)

// Rule: errors carry one prefix per layer: core's "dislock: pg: acquire
// "k": " (or release, or the store clock) wraps the driver's error, and the
// backend adds no "pg: acquire:" layer of its own.
func TestErrorPrefixOnce(t *testing.T) {
	admin := newPool(t, nil)
	table := newTable(t, admin)
	pool := newPool(t, nil)
	ctx := ctxT(t)
	l, err := pg.New(ctx, pool, pg.WithTable(table), pg.WithoutListen())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	pool.Close() // every call now fails in the driver
	for _, opts := range [][]core.Option{{core.TTL(core.DefaultTTL)}, {core.ForSlot(core.Every(time.Hour))}} {
		_, err := l.TryAcquire(ctx, "prefix-once", opts...)
		if err == nil {
			t.Fatal("acquired on a closed pool")
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "dislock: pg: ") || strings.Count(msg, "pg:") != 1 || strings.Count(msg, "acquire") > 1 {
			t.Errorf("error %q: want one dislock: pg: prefix and no other layer naming the backend", msg)
		}
	}
}
