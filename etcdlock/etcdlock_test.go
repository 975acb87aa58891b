package etcdlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/etcdlock"
	"github.com/dislock/dislock/internal/testenv"
)

func TestParseURL(t *testing.T) {
	for _, c := range []struct {
		raw       string
		endpoints []string
		user      string
		tls       bool
	}{
		{"etcd://127.0.0.1:2379", []string{"http://127.0.0.1:2379"}, "", false},
		{"etcd://a:1,b:2,c", []string{"http://a:1", "http://b:2", "http://c:2379"}, "", false},
		{"etcds://u:secret@h1:2379,h2:2380/", []string{"https://h1:2379", "https://h2:2380"}, "u", true},
		{"etcd://[::1]:2379", []string{"http://[::1]:2379"}, "", false},
	} {
		cfg, err := etcdlock.ParseURL(c.raw)
		if err != nil {
			t.Errorf("ParseURL(%q): %v", c.raw, err)
			continue
		}
		if strings.Join(cfg.Endpoints, " ") != strings.Join(c.endpoints, " ") {
			t.Errorf("ParseURL(%q) endpoints = %v, want %v", c.raw, cfg.Endpoints, c.endpoints)
		}
		if cfg.Username != c.user || (c.user != "" && cfg.Password != "secret") {
			t.Errorf("ParseURL(%q) user = %q", c.raw, cfg.Username)
		}
		if (cfg.TLS != nil) != c.tls {
			t.Errorf("ParseURL(%q) TLS = %v", c.raw, cfg.TLS != nil)
		}
	}
	for _, raw := range []string{
		"redis://u:hunter2@h:1", "etcd://u:hunter2@", "etcd://u:hunter2@h:1/path",
		"etcd://u:hunter2@h:1?x=1", "etcd://u:hunter2@a:1,,b:2", "etcd:hunter2", "%zz hunter2",
	} {
		_, err := etcdlock.ParseURL(raw)
		if err == nil {
			t.Errorf("ParseURL(%q) accepted", raw)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("ParseURL error shows the password: %v", err)
		}
	}
}

func TestOptions(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, DialTimeout: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := etcdlock.NewBackend(cli, etcdlock.WithPrefix("")); !errors.Is(err, core.ErrInvalidOption) || !strings.Contains(err.Error(), "WithPrefix") {
		t.Errorf("empty prefix: %v", err)
	}
	if _, err := etcdlock.New(nil); !errors.Is(err, core.ErrInvalidOption) {
		t.Errorf("nil client: %v", err)
	}
	b, err := etcdlock.NewBackend(cli)
	if err != nil {
		t.Fatal(err)
	}
	// MaxLeaseTTL is a duration: etcd's 9e9 seconds, not 9 s.
	if etcdlock.MaxLeaseTTL != 9_000_000_000*time.Second {
		t.Errorf("MaxLeaseTTL = %v, want 9e9 s", time.Duration(etcdlock.MaxLeaseTTL))
	}
	// A TTL etcd would refuse is rejected before anything is sent.
	_, err = b.TryAcquire(context.Background(), core.AcquireRequest{Key: "k", OwnerToken: "t", TTL: etcdlock.MaxLeaseTTL + time.Second})
	if !errors.Is(err, core.ErrInvalidOption) || !strings.Contains(err.Error(), "TTL") {
		t.Errorf("TTL above etcd's longest lease: %v", err)
	}
	_, err = b.TryAcquire(context.Background(), core.AcquireRequest{Key: "k", OwnerToken: "t", ExpireAt: time.Now().Add(etcdlock.MaxLeaseTTL + time.Second)})
	if !errors.Is(err, core.ErrInvalidOption) || !strings.Contains(err.Error(), "ForSlot") {
		t.Errorf("slot above etcd's longest lease: %v", err)
	}
	if _, err := b.TryAcquire(context.Background(), core.AcquireRequest{Key: "", OwnerToken: "t", TTL: time.Second}); !errors.Is(err, core.ErrInvalidKey) {
		t.Errorf("empty key: %v", err)
	}
}

// lockerOn is a Locker on a client of cfg, with the client's logger
// silenced; both close when t ends.
func lockerOn(t *testing.T, cfg clientv3.Config) *core.Client {
	t.Helper()
	cfg.Logger = zap.NewNop()
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	l, err := etcdlock.New(cli)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// Rule: errors carry one prefix per layer: core's "dislock: etcd: acquire
// "k": " wraps the client's error, and the backend adds no "etcdlock:"
// layer of its own.
func TestErrorPrefixOnce(t *testing.T) {
	l := lockerOn(t, clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, DialTimeout: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := l.TryAcquire(ctx, "prefix-once", core.TTL(5*time.Second))
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
	cfg, err := etcdlock.ParseURL("etcd://" + testenv.ClosedAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	l := lockerOn(t, cfg)
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
