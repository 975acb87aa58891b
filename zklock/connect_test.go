package zklock_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/zklock"
)

// closedPort returns a 127.0.0.1 address on which nothing listens.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// Rule: New fails at once, naming the cause, when no server takes
// connections, instead of waiting out ctx with "no ZooKeeper session
// established: context deadline exceeded" (15 s and more before).
func TestNewFailsFastOnConnectionRefused(t *testing.T) {
	t.Parallel()
	a, b := closedPort(t), closedPort(t)
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, silent, until the listener closes
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	start := time.Now()
	l, err := zklock.New(ctx, ln.Addr().String(), zklock.WithSessionTimeout(time.Second))
	if err == nil {
		l.Close()
		t.Fatal("New got a session from a silent server")
	}
	if took := time.Since(start); took < time.Second || !strings.Contains(err.Error(), "no ZooKeeper session established") {
		t.Fatalf("New = %v after %v, want to wait for ctx", err, took)
	}
}
