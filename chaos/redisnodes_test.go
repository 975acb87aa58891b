package chaos

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dislock/dislock/internal/redistest"
)

// redisProc is one redis-server process (a data node or a sentinel) of a
// private topology, on a free loopback port, without persistence. It is
// stopped by PID when the test ends.
type redisProc struct {
	port int
	dir  string
	args []string
	child
}

// needRedisBinaries skips (fails under CI=true) when redis-server or
// redis-cli is missing.
func needRedisBinaries(t testing.TB) {
	t.Helper()
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			err = fmt.Errorf("%s not installed; scripts/services.sh installs it (apt-get install redis-server redis-tools)", bin)
			if ciMode() {
				t.Fatal(err)
			}
			t.Skip(err)
		}
	}
}

func (p *redisProc) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)) }

func (p *redisProc) start() error {
	cmd := exec.Command("redis-server", p.args...)
	cmd.Dir = p.dir
	if err := p.launch(cmd, filepath.Join(p.dir, "stdout.log")); err != nil {
		return err
	}
	return p.waitUp(10*time.Second, 10*time.Millisecond, fmt.Sprintf("redis-server on %s (log in %s)", p.addr(), p.dir), func() error {
		c, err := net.DialTimeout("tcp", p.addr(), 100*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err
	})
}

// startRedisProc starts redis-server with args (plus port, bind, dir and
// log) in a directory of its own.
func startRedisProc(t testing.TB, port int, args ...string) *redisProc {
	t.Helper()
	dir := t.TempDir()
	p := &redisProc{port: port, dir: dir}
	if len(args) > 0 && strings.HasSuffix(args[0], ".conf") {
		p.args = args // a config file (a sentinel): it sets its own port
	} else {
		p.args = append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--protected-mode", "no",
			"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "redis.log")}, args...)
	}
	if err := p.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.kill() })
	return p
}

// topoOptions are the options of the clients of a private topology whose
// entry points are ps (a Cluster's nodes, the sentinels): the sentinel
// password, short timeouts that follow ctx, and a small pool.
func topoOptions(ps []*redisProc) *redis.UniversalOptions {
	var addrs []string
	for _, p := range ps {
		addrs = append(addrs, p.addr())
	}
	return &redis.UniversalOptions{Addrs: addrs, Password: sentinelPW,
		DialTimeout: 500 * time.Millisecond, ReadTimeout: time.Second, WriteTimeout: time.Second,
		ContextTimeoutEnabled: true, PoolSize: 4}
}

// procAt is the process of ps that listens on addr, or nil.
func procAt(ps []*redisProc, addr string) *redisProc {
	for _, p := range ps {
		if p.addr() == addr {
			return p
		}
	}
	return nil
}

// dataNodeArgs are the arguments every data node of a private topology
// gets: the sentinel password as its password and its replicas' master
// password, and quick replication.
func dataNodeArgs() []string {
	return []string{"--requirepass", sentinelPW, "--masterauth", sentinelPW,
		"--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0", "--repl-ping-replica-period", "1"}
}

// redisRole returns a node's role ("master" or "slave") and, for a replica,
// whether its link to the master is up.
func redisRole(ctx context.Context, addr string) (role string, linkUp bool, err error) {
	c := redis.NewClient(&redis.Options{Addr: addr, Password: sentinelPW, DialTimeout: 300 * time.Millisecond,
		ReadTimeout: time.Second, MaxRetries: -1})
	defer c.Close()
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return "", false, err
	}
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, "role:"); ok {
			role = v
		}
		if v, ok := strings.CutPrefix(line, "master_link_status:"); ok {
			linkUp = v == "up"
		}
	}
	return role, linkUp, nil
}

// servedBy returns the port of the server c's commands reach.
func servedBy(ctx context.Context, c redis.Cmdable) (int, error) {
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "tcp_port:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, fmt.Errorf("no tcp_port in INFO")
}

// waitFor polls cond every 50ms until it holds or within passes.
func waitFor(within time.Duration, what string, cond func() (bool, error)) error {
	var last error
	for deadline := time.Now().Add(within); ; {
		ok, err := cond()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %v (last error: %v)", what, within, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// redisRecordToken is the fencing token in a lock record, held or a
// tombstone ("<flags>|<token>[|...]").
func redisRecordToken(v string) (uint64, error) {
	_, rest, _ := strings.Cut(v, "|")
	tok, _, _ := strings.Cut(rest, "|")
	return strconv.ParseUint(tok, 10, 64)
}

// redisLookup looks the witness's locks up through c: the token of each
// lock record that exists (a released lock's tombstone keeps it).
func redisLookup(c redis.UniversalClient, prefix string) lookup {
	return func(ctx context.Context, keys []string) (map[string]uint64, error) {
		cmds := make([]*redis.StringCmd, len(keys))
		_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, k := range keys {
				cmds[i] = p.Get(ctx, redistest.LockKey(prefix, k))
			}
			return nil
		})
		if err != nil && err != redis.Nil {
			return nil, err
		}
		out := map[string]uint64{}
		for i, cmd := range cmds {
			rec, err := cmd.Result()
			if err == redis.Nil {
				continue
			}
			if err != nil {
				return nil, err
			}
			v, err := redisRecordToken(rec)
			if err != nil {
				return nil, fmt.Errorf("lock record %q: %w", rec, err)
			}
			out[keys[i]] = v
		}
		return out, nil
	}
}
