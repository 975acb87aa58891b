package zklock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/zklock"
)

type quiet struct{}

func (quiet) Printf(string, ...any) {}

// Rule: errors carry one prefix per layer: core's "dislock: zookeeper:
// acquire "k": " wraps the client's error, and the backend adds no
// "zklock:" layer of its own.
func TestErrorPrefixOnce(t *testing.T) {
	conn, _, err := zk.Connect([]string{"127.0.0.1:1"}, 4*time.Second, zk.WithLogger(quiet{}))
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
