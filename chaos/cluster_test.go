package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dislock/dislock/internal/redistest"
)

// clusterTopo is a private Redis Cluster of three masters, each with one
// replica, on loopback ports; node timeout 1s, so a killed master is
// replaced within a few seconds.
type clusterTopo struct {
	nodes []*redisProc
}

func startClusterTopo(t *testing.T) *clusterTopo {
	t.Helper()
	needRedisBinaries(t)
	ct := &clusterTopo{}
	var addrs []string
	for range 6 {
		p := startRedisProc(t, redistest.ClusterPort(t), append(dataNodeArgs(), "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "1000")...)
		ct.nodes = append(ct.nodes, p)
		addrs = append(addrs, p.addr())
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	cmd := exec.Command("redis-cli", args...)
	cmd.Env = append(os.Environ(), "REDISCLI_AUTH="+sentinelPW) // not on the command line
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, strings.ReplaceAll(string(out), sentinelPW, "***"))
	}
	ctx := context.Background()
	for _, n := range ct.nodes {
		c := redis.NewClient(&redis.Options{Addr: n.addr(), Password: sentinelPW})
		err := waitFor(30*time.Second, "cluster node "+n.addr()+" ok and replicated", func() (bool, error) {
			info, err := c.ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				return false, err
			}
			role, up, err := redisRole(ctx, n.addr())
			return role == "master" || up, err
		})
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	return ct
}

// options are the cluster clients' options. A ClusterClient learns that a
// killed master was replaced only when it reloads the slot map: on a MOVED
// reply (which a dead node never sends) or when the map is older than
// ClusterStateReloadInterval, 60s by default. With that default the clients
// keep dialling the dead master for up to a minute, so it is set to a second.
func (ct *clusterTopo) options() *redis.ClusterOptions {
	o := topoOptions(ct.nodes).Cluster()
	o.ClusterStateReloadInterval = time.Second
	return o
}

// masterOf returns the address of the master that serves slot, and of its
// replicas, as the cluster reports them (asking any live node).
func (ct *clusterTopo) masterOf(ctx context.Context, slot int64) (master string, replicas []string, err error) {
	for _, n := range ct.nodes {
		c := redis.NewClient(&redis.Options{Addr: n.addr(), Password: sentinelPW, DialTimeout: 300 * time.Millisecond, MaxRetries: -1})
		slots, e := c.ClusterSlots(ctx).Result()
		c.Close()
		if e != nil {
			err = e
			continue
		}
		for _, s := range slots {
			if int64(s.Start) <= slot && slot <= int64(s.End) && len(s.Nodes) > 0 {
				for _, r := range s.Nodes[1:] {
					replicas = append(replicas, r.Addr)
				}
				return s.Nodes[0].Addr, replicas, nil
			}
		}
	}
	return "", nil, fmt.Errorf("no node serves slot %d: %v", slot, err)
}

// TestChaosCluster fails over the master of the hot keys' slot of a private
// Redis Cluster (three masters, a replica each) while holders and waiters
// run: CLUSTER FAILOVER on its replica (a coordinated hand-over, which
// loses nothing), then SIGKILL of the new master (its replica takes over
// after the node timeout, and may lack the last writes). The checks are
// those of the Sentinel run.
func TestChaosCluster(t *testing.T) {
	ct := startClusterTopo(t)
	newClient := func() *redis.ClusterClient { return redis.NewClusterClient(ct.options()) }
	figs := redisFailovers(t, "cluster", "Redis Cluster", newClient, func(ctx context.Context, admin, probe *redis.ClusterClient, hot string, switched map[string]time.Duration) (func(context.Context) error, []stepFault) {
		slot, err := admin.ClusterKeySlot(ctx, hot).Result()
		if err != nil {
			t.Fatal(err)
		}
		// failover runs do on the hot slot's master and replica, then waits
		// until the replica serves the slot and the clients' commands reach
		// it.
		failover := func(name string, stateLoss bool, do func(master, replica string) error) stepFault {
			return stepFault{name: name, stateLoss: stateLoss, run: func(ctx context.Context) error {
				master, replicas, err := ct.masterOf(ctx, slot)
				if err != nil {
					return err
				}
				if len(replicas) == 0 {
					return fmt.Errorf("the master of slot %d has no replica", slot)
				}
				start := time.Now()
				if err := do(master, replicas[0]); err != nil {
					return err
				}
				if err := waitFor(30*time.Second, "the replica serves the slot", func() (bool, error) {
					m, _, err := ct.masterOf(ctx, slot)
					return m == replicas[0], err
				}); err != nil {
					return err
				}
				switched[name] = time.Since(start)
				want := procAt(ct.nodes, replicas[0]).port
				for _, cc := range []*redis.ClusterClient{admin, probe} {
					if err := waitFor(15*time.Second, "the cluster clients follow the new master", func() (bool, error) {
						if err := cc.Exists(ctx, hot).Err(); err != nil {
							return false, err
						}
						c, err := cc.MasterForKey(ctx, hot)
						if err != nil {
							return false, err
						}
						p, err := servedBy(ctx, c)
						return p == want, err
					}); err != nil {
						return err
					}
				}
				return nil
			}}
		}
		return func(ctx context.Context) error { return probe.Exists(ctx, hot).Err() }, []stepFault{
			failover("cluster-failover", false, func(_, replica string) error {
				c := redis.NewClient(&redis.Options{Addr: replica, Password: sentinelPW})
				defer c.Close()
				return c.ClusterFailover(ctx).Err()
			}),
			failover("cluster-kill-master", true, func(master, _ string) error {
				procAt(ct.nodes, master).kill()
				return nil
			}),
		}
	})
	for _, f := range figs {
		if f.Fault == "cluster-failover" && f.Lost != 0 {
			t.Errorf("CLUSTER FAILOVER hands over after the replica caught up, yet %d acknowledged locks were lost", f.Lost)
		}
	}
}
