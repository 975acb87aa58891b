package chaos

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/zktest"
	"github.com/dislock/dislock/zklock"
)

// zkSession is the session timeout of the ZooKeeper contenders: the TTL
// (1.5 s in the short tier) must be at most 2/3 of it.
const zkSession = 3 * time.Second

type zkLogger struct{}

func (zkLogger) Printf(format string, v ...any) { fmt.Fprintf(libLogs, format+"\n", v...) }

// zkSetup runs the contenders on a private standalone ZooKeeper server
// (Debian's zookeeper package), stopped by PID when the test ends. Its own
// fault: the server is killed with SIGKILL and restarted from its data.
func zkSetup(t *testing.T, h *Harness, keys []string, prefix string) *backendEnv {
	if err := zktest.Installed(); err != nil {
		if ciMode() {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	ens, err := zktest.Start(t.TempDir(), 1, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ens.Stop)
	node := ens.Nodes[0]
	px, err := h.Add("zookeeper", node.Addr())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	root := "/dislock-chaos-" + strings.TrimSuffix(prefix, "-")
	admin, err := zklock.New(ctx, node.Addr(), zklock.WithRoot(root), zklock.WithSessionTimeout(10*time.Second),
		zklock.WithLogger(zkLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	direct := admin.Backend().(*zklock.Backend).Conn()
	env := &backendEnv{name: "zookeeper", proxy: px, admin: admin, keyPrefix: prefix}
	if u, ok := optionalPG(); ok {
		pool := directPool(t, u, "dislock-chaos-direct")
		reg, err := newRegister(ctx, pool, keys)
		if err != nil {
			t.Fatal(err)
		}
		env.reg = reg
	}
	env.newLocker = func(ctx context.Context, opts ...core.ClientOption) (core.Locker, func() error, error) {
		l, err := zklock.New(ctx, px.Addr(), zklock.WithRoot(root), zklock.WithSessionTimeout(zkSession),
			zklock.WithLogger(zkLogger{}), zklock.WithClientOptions(opts...))
		if err != nil {
			return nil, nil, err
		}
		return l, l.Close, nil
	}
	layout := admin.Backend().(*zklock.Backend)
	env.deleteKeys = func(ctx context.Context, keys []string) ([]removal, error) {
		var out []removal
		for _, k := range keys {
			// Each child's czxid (a claim's fencing token) before it is
			// deleted; a sequential node's name is never reused under its
			// parent, so a delete that succeeds removed that node.
			rm := removal{key: k, sent: time.Now()}
			parent := layout.KeyPath(k)
			names, _, err := direct.Children(parent)
			if err != nil && !errors.Is(err, zk.ErrNoNode) {
				return out, err
			}
			for _, n := range names {
				ok, st, err := direct.Exists(parent + "/" + n)
				if err != nil {
					return out, err
				}
				if !ok {
					continue
				}
				err = direct.Delete(parent+"/"+n, -1)
				if err == nil {
					rm.tokens = append(rm.tokens, uint64(st.Czxid))
				} else if !errors.Is(err, zk.ErrNoNode) {
					return out, err
				}
			}
			rm.done = time.Now()
			out = append(out, rm)
		}
		return out, nil
	}
	probeB, err := zklock.NewBackend(ctx, px.Addr(), zklock.WithRoot(root), zklock.WithLogger(zkLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	env.probe = func(ctx context.Context) error {
		_, err := probeB.Now(ctx, "")
		return err
	}
	env.faults = []faultDef{{name: "zookeeper-kill-restart", run: func(ctx context.Context, rng *mrand.Rand) error {
		node.Kill()
		sleepCtx(ctx, between(rng, 100*time.Millisecond, time.Second))
		if err := node.Restart(); err != nil {
			return err
		}
		return ens.WaitServing(30 * time.Second)
	}}}
	env.close = func() {
		_ = admin.Close()
		_ = probeB.Close()
		if env.reg != nil {
			env.reg.pool.Close()
		}
	}
	return env
}

func TestChaosZooKeeper(t *testing.T) {
	chaosSeeds(t, zkSetup)
}

// zkSlowRenewals stalls the renewals of one ZooKeeper Locker (see
// slowRenewals); the engine polls instead of watching through it.
type zkSlowRenewals struct {
	core.Backend
	stalled atomic.Bool
}

func (b *zkSlowRenewals) Renew(ctx context.Context, reqs []core.RenewRequest) ([]error, error) {
	if b.stalled.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return b.Backend.Renew(ctx, reqs)
}

// zkSlowStore is the slow-store scenario on a private ZooKeeper server.
func zkSlowStore(t *testing.T, slowObs, fastObs core.ClientOption) (core.Locker, core.Locker, func() func()) {
	if err := zktest.Installed(); err != nil {
		if ciMode() {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	ens, err := zktest.Start(t.TempDir(), 1, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ens.Stop)
	root := "/dislock-chaos-slow"
	newBackend := func() *zklock.Backend {
		b, err := zklock.NewBackend(context.Background(), ens.Connect(), zklock.WithRoot(root),
			zklock.WithSessionTimeout(1500*time.Millisecond), zklock.WithLogger(zkLogger{}))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	sb := &zkSlowRenewals{Backend: newBackend()}
	a, err := core.New(sb, core.WithDefaults(handoverTiming.options()...), slowObs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	b, err := core.New(newBackend(), core.WithDefaults(handoverTiming.options()...), fastObs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return a, b, func() func() {
		sb.stalled.Store(true)
		return func() { sb.stalled.Store(false) }
	}
}

// TestSlowStoreNoHandoverZooKeeper is TestSlowStoreNoHandover on ZooKeeper:
// the key passes on only after the slow holder's work stopped (its Release)
// or its claim's TTL ran out on the server.
func TestSlowStoreNoHandoverZooKeeper(t *testing.T) {
	checkSlowStore(t, slowStoreHistory(t, 11, zkSlowStore))
}
