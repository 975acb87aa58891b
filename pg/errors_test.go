package pg_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

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

// Rule: a refused connection fails the constructor at once, naming the
// cause, and the password of the URL appears in no message.
func TestConnectionRefusedFailsFast(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	const password = "s3cret-pw"
	pool, err := pgxpool.New(context.Background(), "postgres://dislock:"+password+"@"+addr+"/db?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	l, err := pg.New(ctx, pool)
	took := time.Since(start)
	if err == nil {
		l.Close()
		t.Fatal("New connected to a closed port")
	}
	if msg := err.Error(); took > 5*time.Second || !strings.Contains(msg, "connection refused") || strings.Contains(msg, password) {
		t.Fatalf("New = %q after %v, want the refusal named within 5s, without the password", msg, took)
	}
}
