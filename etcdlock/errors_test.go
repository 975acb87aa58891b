package etcdlock_test

import (
	"context"
	"errors"
	"net"
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

// Rule: a refused connection fails an acquisition at once, naming the
// cause: the lease grant that never left is not undone (before, the undo's
// release waited out the release timeout, 5 s).
func TestConnectionRefusedFailsFast(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg, err := etcdlock.ParseURL("etcd://" + addr)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger = zap.NewNop()
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	l, err := etcdlock.New(cli)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err = l.TryAcquire(ctx, "refused")
	took := time.Since(start)
	if err == nil {
		t.Fatal("acquired on a closed port")
	}
	if took > 2500*time.Millisecond || !strings.Contains(err.Error(), "connection refused") || errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("TryAcquire = %v after %v, want the refusal named within 2.5s", err, took)
	}
}
