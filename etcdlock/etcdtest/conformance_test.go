package etcdtest_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/locktest"
	"github.com/dislock/dislock/etcdlock"
	"github.com/dislock/dislock/etcdlock/etcdtest"
	"github.com/dislock/dislock/internal/testenv"
)

// uniquePrefix returns a key prefix no other test uses.
func uniquePrefix(name string) string {
	return "dislocktest/" + name + "-" + strings.ToLower(rand.Text()[:10]) + "/"
}

// harness builds a locktest harness over clients made from cfg, each
// acting as a separate process. Steal and Delete act with plain etcd
// requests, as another process or an operator would.
func harness(t *testing.T, prefix string, cfg clientv3.Config) locktest.Harness {
	admin := etcdtest.NewClient(t, cfg)
	backend := func(t testing.TB, cfg clientv3.Config) core.Backend {
		b, err := etcdlock.NewBackend(etcdtest.NewClient(t, cfg), etcdlock.WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	return locktest.Harness{
		// etcd's lessor looks for expired leases every 500ms and revokes
		// them by a consensus write; its lease TTLs are whole seconds.
		ExpiryLag:  500 * time.Millisecond,
		NewBackend: func(t testing.TB) core.Backend { return backend(t, cfg) },
		Stall: func(t testing.TB) (core.Backend, func(), func()) {
			// Every endpoint through a proxy of its own.
			scfg := cfg
			scfg.Endpoints = nil
			var ps testenv.StallProxies
			for _, ep := range cfg.Endpoints {
				scheme, host, ok := strings.Cut(ep, "://")
				if !ok {
					scheme, host = "", ep
				}
				p := testenv.NewStallProxy(t, "tcp", host)
				ps = append(ps, p)
				if scheme != "" {
					scheme += "://"
				}
				scfg.Endpoints = append(scfg.Endpoints, scheme+p.Addr())
			}
			return backend(t, scfg), ps.Stall, ps.Resume
		},
		Steal: func(ctx context.Context, key string) error {
			return steal(ctx, admin, prefix+key)
		},
		Delete: func(ctx context.Context, key string) error {
			// The lock key, and a semaphore's permit keys:
			// <prefix><key> NUL <owner token>.
			_, err := admin.Txn(ctx).Then(clientv3.OpDelete(prefix+key),
				clientv3.OpDelete(prefix+key+"\x00", clientv3.WithPrefix())).Commit()
			return err
		},
		TTL: minTTL(t, admin),
	}
}

// steal replaces the key k, if it exists, by a thief's key on a lease of
// its own: what another process would hold after the holder's lease ran out.
func steal(ctx context.Context, cli *clientv3.Client, k string) error {
	resp, err := cli.Get(ctx, k)
	if err != nil || len(resp.Kvs) == 0 {
		return err
	}
	l, err := cli.Grant(ctx, 30)
	if err != nil {
		return err
	}
	if _, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", resp.Kvs[0].ModRevision)).
		Then(clientv3.OpDelete(k)).Commit(); err != nil {
		return err
	}
	v, _ := json.Marshal(map[string]any{"owner": "thief", "otoken": "stolen"})
	_, err = cli.Put(ctx, k, string(v), clientv3.WithLease(l.ID))
	return err
}

// minTTL is the lease TTL the timing cases use: 2 s, or the server's
// shortest lease when that is longer. (The embedded servers grant 1 s
// leases, but on a loaded 2-core machine a 1 s TTL leaves renewals too
// little room.)
func minTTL(t testing.TB, cli *clientv3.Client) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := cli.Grant(ctx, 1)
	if err != nil {
		t.Fatalf("lease grant: %v", err)
	}
	cli.Revoke(ctx, l.ID)
	return max(2*time.Second, time.Duration(l.TTL)*time.Second)
}

// sharedOrSingle returns the client config of DISLOCK_TEST_ETCD when it is
// set, and otherwise of a private one-member cluster.
func sharedOrSingle(t *testing.T) clientv3.Config {
	if raw := etcdtest.Shared(t); raw != "" {
		cfg, err := etcdlock.ParseURL(raw)
		if err != nil {
			t.Fatalf("DISLOCK_TEST_ETCD: %v", err)
		}
		cfg.Logger = zap.NewNop()
		return cfg
	}
	return clientv3.Config{Endpoints: etcdtest.Start(t, 1).Endpoints()}
}

// TestConformance runs the conformance suite on one member (or on
// DISLOCK_TEST_ETCD when set).
func TestConformance(t *testing.T) {
	t.Parallel() // with TestConformanceCluster: the suite mostly waits
	locktest.Run(t, harness(t, uniquePrefix("single"), sharedOrSingle(t)))
}

// TestConformanceCluster runs the conformance suite on a 3-member cluster,
// every client connected to all members.
func TestConformanceCluster(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 3)
	locktest.Run(t, harness(t, uniquePrefix("cluster"), clientv3.Config{Endpoints: c.Endpoints()}))
}
