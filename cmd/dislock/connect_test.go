package main

import (
	"net"
	"strings"
	"testing"
	"time"
)

// A refused connection is a runtime failure (exit 1) that comes at once and
// names the cause, on every backend: before, Redis took 1.8 s (go-redis's
// dial retries), etcd 10 s (the undo of a claim that never left) and
// ZooKeeper 15 s ("no ZooKeeper session established: context deadline
// exceeded").
func TestConnectionRefusedFailsFast(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	for _, u := range []string{
		"postgres://user:" + sentinel + "@" + addr + "/db?sslmode=disable",
		"mysql://user:" + sentinel + "@" + addr + "/db",
		"redis://user:" + sentinel + "@" + addr + "/0",
		"etcd://user:" + sentinel + "@" + addr,
		"zk://" + addr,
	} {
		var f *fixture
		env := f.baseEnv(urlVar+"="+u, "LOCK_KEY=k", "CRON_SCHEDULE=@hourly")
		start := time.Now()
		p := run(t, env, urlVar, "true")
		took := time.Since(start)
		expectCode(t, p, 1)
		noSentinel(t, p)
		if took > 5*time.Second || !strings.Contains(p.stderr.String(), "connection refused") {
			t.Errorf("%s: exit after %v, want within 5s naming the refusal: %s", scheme(u), took, p.stderr.String())
		}
	}
}
