package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dislock/dislock/core/locktest"
	"github.com/dislock/dislock/internal/redistest"
	"github.com/dislock/dislock/redislock"
)

const sentinelMaster = "dislock-chaos"

// sentinelTopo is a private Sentinel setup: a master, a replica and three
// sentinels (quorum 2), each a redis-server process on a free loopback
// port. The data nodes use the sentinel password.
type sentinelTopo struct {
	nodes     []*redisProc
	sentinels []*redisProc
}

func startSentinelTopo(t *testing.T) *sentinelTopo {
	t.Helper()
	needRedisBinaries(t)
	st := &sentinelTopo{}
	master := startRedisProc(t, freePort(t), dataNodeArgs()...)
	replica := startRedisProc(t, freePort(t), append(dataNodeArgs(), "--replicaof", "127.0.0.1", strconv.Itoa(master.port))...)
	st.nodes = []*redisProc{master, replica}
	ctx := context.Background()
	if err := waitFor(15*time.Second, "replica in sync", func() (bool, error) {
		role, up, err := redisRole(ctx, replica.addr())
		return role == "slave" && up, err
	}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		dir := t.TempDir()
		port := freePort(t)
		conf := filepath.Join(dir, "sentinel.conf")
		body := fmt.Sprintf(`port %d
bind 127.0.0.1
protected-mode no
dir %s
logfile %s
sentinel monitor %s 127.0.0.1 %d 2
sentinel auth-pass %s %s
sentinel down-after-milliseconds %s 1000
sentinel failover-timeout %s 5000
sentinel parallel-syncs %s 1
`, port, dir, filepath.Join(dir, "sentinel.log"), sentinelMaster, master.port, sentinelMaster, sentinelPW,
			sentinelMaster, sentinelMaster, sentinelMaster)
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		p := &redisProc{port: port, dir: dir, args: []string{conf, "--sentinel"}}
		if err := p.start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.kill() })
		st.sentinels = append(st.sentinels, p)
	}
	// Every sentinel knows the replica and the two other sentinels.
	for _, s := range st.sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: s.addr()})
		err := waitFor(30*time.Second, "sentinel "+s.addr()+" sees the replica and its peers", func() (bool, error) {
			m, err := sc.Master(ctx, sentinelMaster).Result()
			return err == nil && m["num-slaves"] == "1" && m["num-other-sentinels"] == "2", err
		})
		sc.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	return st
}

// failoverOptions are the options of a Sentinel failover client; the
// password is the sentinel.
func (st *sentinelTopo) failoverOptions() *redis.FailoverOptions {
	o := topoOptions(st.sentinels)
	o.MasterName = sentinelMaster
	return o.Failover()
}

// masterAddr is the master every sentinel names; ok is false while they
// disagree.
func (st *sentinelTopo) masterAddr(ctx context.Context) (addr string, ok bool, err error) {
	for i, s := range st.sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: s.addr(), DialTimeout: 300 * time.Millisecond, MaxRetries: -1})
		a, e := sc.GetMasterAddrByName(ctx, sentinelMaster).Result()
		sc.Close()
		if e != nil {
			return "", false, e
		}
		got := strings.Join(a, ":")
		if i > 0 && got != addr {
			return "", false, nil
		}
		addr = got
	}
	return addr, true, nil
}

// TestChaosSentinel runs the conformance suite through
// redis.NewFailoverClient on a private Sentinel setup, then fails the master
// over twice while holders and waiters run: SENTINEL FAILOVER, then SIGKILL
// of the master. Clients must follow the new master, each holder keeps its
// lock or is told of its loss in time, fencing tokens never go backwards,
// and a witness counts the acknowledged locks each failover lost (the
// asynchronous-replication window) and how long until locking worked again.
func TestChaosSentinel(t *testing.T) {
	st := startSentinelTopo(t)
	t.Run("Conformance", func(t *testing.T) {
		newClient := redistest.Clients(func(dial redistest.Dial) *redis.Client {
			o := st.failoverOptions()
			o.Dialer = dial
			return redis.NewFailoverClient(o)
		})
		prefix := strings.TrimSuffix(runPrefix("sentinel-lt"), "-")
		locktest.Run(t, redistest.Harness("chaos:", prefix, newClient(t, nil), newClient))
	})
	t.Run("Failovers", func(t *testing.T) { sentinelFailovers(t, st) })
}

func sentinelFailovers(t *testing.T, st *sentinelTopo) {
	newClient := func() *redis.Client { return redis.NewFailoverClient(st.failoverOptions()) }
	redisFailovers(t, "sentinel", "Redis Sentinel", newClient, func(ctx context.Context, admin, probe *redis.Client, _ string, switched map[string]time.Duration) (func(context.Context) error, []stepFault) {
		// failover runs do (which makes the master go away) and waits until
		// the sentinels agree on another master, that master says so, and
		// the clients' commands reach it.
		failover := func(name string, do func(old string) error, oldBecomesReplica bool) stepFault {
			return stepFault{name: name, stateLoss: true, run: func(ctx context.Context) error {
				old, ok, err := st.masterAddr(ctx)
				if err != nil || !ok {
					return fmt.Errorf("no agreed master before the failover: %v", err)
				}
				start := time.Now()
				if err := do(old); err != nil {
					return err
				}
				var now string
				if err := waitFor(30*time.Second, "the sentinels agree on a new master", func() (bool, error) {
					a, ok, err := st.masterAddr(ctx)
					now = a
					return ok && a != old, err
				}); err != nil {
					return err
				}
				switched[name] = time.Since(start)
				if err := waitFor(15*time.Second, "the new master is a master", func() (bool, error) {
					role, _, err := redisRole(ctx, now)
					return role == "master", err
				}); err != nil {
					return err
				}
				newPort := procAt(st.nodes, now).port
				for _, c := range []*redis.Client{admin, probe} {
					if err := waitFor(15*time.Second, "the failover clients follow the new master", func() (bool, error) {
						p, err := servedBy(ctx, c)
						return p == newPort, err
					}); err != nil {
						return err
					}
				}
				if oldBecomesReplica {
					return waitFor(30*time.Second, "the old master replicates the new one", func() (bool, error) {
						role, up, err := redisRole(ctx, old)
						return role == "slave" && up, err
					})
				}
				return nil
			}}
		}
		return func(ctx context.Context) error { return probe.Ping(ctx).Err() }, []stepFault{
			failover("sentinel-failover", func(string) error {
				sc := redis.NewSentinelClient(&redis.Options{Addr: st.sentinels[0].addr()})
				defer sc.Close()
				return sc.Failover(ctx, sentinelMaster).Err()
			}, true),
			failover("sentinel-kill-master", func(old string) error {
				procAt(st.nodes, old).kill()
				return nil
			}, false),
		}
	})
}

// redisFailovers is a failover run on a Redis topology (Sentinel,
// Cluster) whose clients newClient makes: contenders and a witness lock
// two hot keys while the faults run, one after another, and the figures
// that hold whatever a failover lost are checked (checkFailoverFigures).
// steps returns the run's probe and faults, given an admin client and a
// probe client (both closed when the run ends), the Redis name of the
// first hot key, and the map in which each fault records how long the
// topology took to switch. The figures are returned for checks of the
// topology's own.
func redisFailovers[C redis.UniversalClient](t *testing.T, name, topo string, newClient func() C,
	steps func(ctx context.Context, admin, probe C, hot string, switched map[string]time.Duration) (func(context.Context) error, []stepFault)) []faultFigures {
	ctx := context.Background()
	// The clients' background goroutines (go-redis follows the topology in
	// one) must all end once they are closed.
	ignore := goleak.IgnoreCurrent()
	defer func() {
		if err := findLeaks(ignore); err != nil {
			t.Errorf("goroutines still running after the run: %v", err)
		}
	}()
	prefix := runPrefix(name)
	rprefix := "dislock-" + strings.TrimSuffix(prefix, "-")
	keys := []string{prefix + "hot-0", prefix + "hot-1"}
	logs := &sink{}
	rec := NewRecorder(0)
	adminC, probeC := newClient(), newClient()
	defer adminC.Close()
	defer probeC.Close()
	admin, err := redislock.New(adminC, redislock.WithPrefix(rprefix))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	env := &backendEnv{name: name, admin: admin, keyPrefix: prefix, newLocker: redisLockers(newClient, rprefix)}
	defer withRegister(t, env, keys)()
	switched := map[string]time.Duration{}
	probe, faults := steps(ctx, adminC, probeC, redistest.LockKey(rprefix, keys[0]), switched)
	env.probe = probe
	w, endWitness := startWitness(t, rec, logs, prefix, 25*time.Millisecond, env.newLocker)
	defer endWitness()
	cfg := runConfig{contenders: 3, keys: len(keys), timing: shortTiming}
	rep, allowed := runSteps(t, cfg, env, keys, rec, logs, 2*time.Second, faults)
	w.halt()
	figs := w.measure(t, rec.History(), redisLookup(adminC, rprefix))
	checkFailoverFigures(t, topo, figs, rep, allowed, switched)
	return figs
}

// checkFailoverFigures logs each failover's figures and checks the rules
// that hold whatever a failover lost.
func checkFailoverFigures(t *testing.T, topo string, figs []faultFigures, rep Report, allowed []Violation, switched map[string]time.Duration) {
	t.Helper()
	lost := 0
	for _, f := range figs {
		lost += f.Lost
		figure(t, "%s, %v; topology switched %v after the fault began", topo, f, switched[f.Fault].Round(time.Millisecond))
		if f.Acked < 20 {
			t.Errorf("%s: only %d acquisitions acknowledged before it: too few to tell", f.Fault, f.Acked)
		}
		if f.Unaware != 0 {
			t.Errorf("%s: %d holders still think they hold a lock the failover lost", f.Fault, f.Unaware)
		}
		if f.Regressions != 0 {
			t.Errorf("%s: %d witness tokens went backwards", f.Fault, f.Regressions)
		}
		if f.Recovery < 0 {
			t.Errorf("%s: locking never worked again", f.Fault)
		}
	}
	if n := tokenRegressions(rep); n != 0 {
		t.Errorf("%s: %d token regressions in the contenders' history", topo, n)
	}
	overlaps := 0
	for _, v := range allowed {
		if v.Rule == RuleOverlap {
			overlaps++
		}
	}
	figure(t, "%s: %d failovers, %d acknowledged locks lost in all, %d double grants of a hot key within a failover, %d token regressions",
		topo, len(figs), lost, overlaps, tokenRegressions(rep))
}
