package zklock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/locktest"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/zklock"
)

// harness runs locktest against connect, with opts given to every
// Backend. Steal and Delete act on the nodes with a plain client, as an
// operator or another process would, authenticated with adminAuth
// ("scheme", "credentials" pairs) when the nodes are protected.
func harness(t *testing.T, connect string, adminAuth []string, opts ...zklock.Option) locktest.Harness {
	root := testRoot()
	admin := rawConn(t, connect)
	for i := 0; i+1 < len(adminAuth); i += 2 {
		if err := admin.AddAuth(adminAuth[i], []byte(adminAuth[i+1])); err != nil {
			t.Fatal(err)
		}
	}
	var layout *zklock.Backend // for the key layout only
	claims := func(key string) (string, []string, error) {
		parent := layout.KeyPath(key)
		// The admin's server may be a follower that has not yet applied
		// the holder's claim: a read there is not linearizable. Sync
		// first, or an ensemble's Delete and Steal may find no claim.
		if _, err := admin.Sync(parent); err != nil && !errors.Is(err, zk.ErrNoNode) {
			return parent, nil, err
		}
		names, _, err := admin.Children(parent)
		if errors.Is(err, zk.ErrNoNode) {
			return parent, nil, nil
		}
		var out []string
		for _, n := range names {
			if strings.HasPrefix(n, "l-") || strings.HasPrefix(n, "p-") { // lock and permit claims
				out = append(out, parent+"/"+n)
			}
		}
		return parent, out, err
	}
	del := func(ctx context.Context, key string) error {
		_, paths, err := claims(key)
		for _, p := range paths {
			if err := admin.Delete(p, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
				return err
			}
		}
		return err
	}
	h := locktest.Harness{
		NewBackend: func(t testing.TB) core.Backend {
			// Some cases ask for 60 s leases: the session must allow them
			// (TTL ≤ 2/3 of the session timeout). The private servers allow
			// sessions of up to 120 s; a DISLOCK_TEST_ZK server must too.
			b := newBackend(t, connect, root, append([]zklock.Option{zklock.WithSessionTimeout(conformanceSession)}, opts...)...)
			if layout == nil {
				layout = b
			}
			return b
		},
		Steal: func(ctx context.Context, key string) error {
			parent, _, err := claims(key)
			if err != nil {
				return err
			}
			if err := del(ctx, key); err != nil {
				return err
			}
			_, err = admin.Create(parent+"/l-THIEF-", zklock.ClaimData(time.Hour, "thief"), zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll))
			return err
		},
		Stall: func(t testing.TB) (core.Backend, func(), func()) {
			// Every server through a proxy of its own.
			hosts, chroot, rooted := strings.Cut(connect, "/")
			var ps testenv.StallProxies
			var addrs []string
			for _, h := range strings.Split(hosts, ",") {
				p := testenv.NewStallProxy(t, "tcp", h)
				ps = append(ps, p)
				addrs = append(addrs, p.Addr())
			}
			c := strings.Join(addrs, ",")
			if rooted {
				c += "/" + chroot
			}
			b := newBackend(t, c, root, append([]zklock.Option{zklock.WithSessionTimeout(conformanceSession)}, opts...)...)
			return b, ps.Stall, ps.Resume
		},
		Delete:    del,
		KeyPrefix: "zklock:",
		TTL:       time.Second,
	}
	layout = newBackend(t, connect, root, opts...)
	return h
}

const conformanceSession = 95 * time.Second

func TestConformance(t *testing.T) {
	t.Parallel() // each suite has its own key prefix; the suites mostly wait on timers
	locktest.Run(t, harness(t, singleConnect(t), nil))
}

func TestConformanceEnsemble(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node ensemble")
	}
	t.Parallel()
	locktest.Run(t, harness(t, ensemble(t, 3).Connect(), nil))
}

// TestConformanceAuth runs the suite with digest authentication and the
// default CreatorAll ACL it brings: the nodes are closed to everyone else,
// and the engine's rules hold as on open nodes.
func TestConformanceAuth(t *testing.T) {
	t.Parallel()
	cred, _ := digest()
	locktest.Run(t, harness(t, singleConnect(t), []string{"digest", cred}, zklock.WithAuth("digest", []byte(cred))))
}
