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
	"github.com/dislock/dislock/zklock"
)

// harness runs locktest against connect. Steal and Delete act on the nodes
// with a plain client, as an operator or another process would.
func harness(t *testing.T, connect string) locktest.Harness {
	root := testRoot()
	admin := rawConn(t, connect)
	var layout *zklock.Backend // for the key layout only
	claims := func(key string) (string, []string, error) {
		parent := layout.KeyPath(key)
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
			b := newBackend(t, connect, root, zklock.WithSessionTimeout(conformanceSession))
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
		Delete:    del,
		KeyPrefix: "zklock:",
		TTL:       time.Second,
	}
	layout = newBackend(t, connect, root)
	return h
}

const conformanceSession = 95 * time.Second

func TestConformance(t *testing.T) {
	locktest.Run(t, harness(t, singleConnect(t)))
}

func TestConformanceEnsemble(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node ensemble")
	}
	locktest.Run(t, harness(t, ensemble(t, 3).Connect()))
}
