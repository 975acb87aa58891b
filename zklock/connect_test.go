package zklock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/zklock"
)

// Rule: New fails at once, naming the cause, when no server takes
// connections, instead of waiting out ctx with "no ZooKeeper session
// established: context deadline exceeded" (15 s and more before).
func TestNewFailsFastOnConnectionRefused(t *testing.T) {
	t.Parallel()
	a, b := testenv.ClosedAddr(t), testenv.ClosedAddr(t)
	for _, connect := range []string{a, a + "," + b} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		start := time.Now()
		l, err := zklock.New(ctx, connect)
		cancel()
		took := time.Since(start)
		if err == nil {
			l.Close()
			t.Fatalf("New(%s) connected to nothing", connect)
		}
		msg := err.Error()
		if took > 5*time.Second || !strings.Contains(msg, "no ZooKeeper server reachable") || !strings.Contains(msg, "connection refused") {
			t.Fatalf("New(%s) = %q after %v, want a refusal named within 5s", connect, msg, took)
		}
		for _, addr := range strings.Split(connect, ",") {
			if !strings.Contains(msg, addr) {
				t.Errorf("New(%s) = %q: the refusal of %s is not named", connect, msg, addr)
			}
		}
	}
}

// A server that takes the connection but gives no session (an ensemble
// without quorum) is waited for until ctx ends, as before.
func TestNewWaitsForASessionFromAServerThatAnswers(t *testing.T) {
	t.Parallel()
	silent := testenv.SilentServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	start := time.Now()
	l, err := zklock.New(ctx, silent, zklock.WithSessionTimeout(time.Second))
	if err == nil {
		l.Close()
		t.Fatal("New got a session from a silent server")
	}
	if took := time.Since(start); took < time.Second || !strings.Contains(err.Error(), "no ZooKeeper session established") {
		t.Fatalf("New = %v after %v, want to wait for ctx", err, took)
	}
}

// Rule: errors carry one prefix per layer: core's "dislock: zookeeper:
// acquire "k": " wraps the client's error, and the backend adds no
// "zklock:" layer of its own.
func TestErrorPrefixOnce(t *testing.T) {
	conn, _, err := zk.Connect([]string{"127.0.0.1:1"}, 4*time.Second, zk.WithLogger(nopLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	l, err := zklock.NewFromConn(conn, 4*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = l.TryAcquire(ctx, "prefix-once", core.TTL(2*time.Second))
	if err == nil {
		t.Fatal("acquired with no server")
	}
	msg := err.Error()
	if !strings.Contains(msg, `dislock: zookeeper: acquire "prefix-once": `) || strings.Contains(msg, "zklock") {
		t.Errorf("error %q: want one dislock: zookeeper: prefix and no other layer naming the backend", msg)
	}
}
