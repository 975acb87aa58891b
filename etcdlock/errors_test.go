package etcdlock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/etcdlock"
)

// Rule: errors carry one prefix per layer: core's "dislock: etcd: acquire
// "k": " wraps the client's error, and the backend adds no "etcdlock:"
// layer of its own.
func TestErrorPrefixOnce(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	l, err := etcdlock.New(cli)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = l.TryAcquire(ctx, "prefix-once", core.TTL(5*time.Second))
	if err == nil {
		t.Fatal("acquired on an unreachable server")
	}
	msg := err.Error()
	if !strings.Contains(msg, `dislock: etcd: acquire "prefix-once": `) || strings.Count(msg, "etcd") != 1 {
		t.Errorf("error %q: want one dislock: etcd: prefix and no other layer naming the backend", msg)
	}
}
