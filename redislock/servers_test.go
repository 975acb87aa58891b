package redislock_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/dislock/dislock/internal/redistest"
	"github.com/dislock/dislock/internal/testenv"
)

// sharedRedis returns a client on the machine's Redis (DISLOCK_TEST_REDIS),
// closed when t ends.
func sharedRedis(t testing.TB) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(testenv.Redis(t))
	if err != nil {
		t.Fatalf("DISLOCK_TEST_REDIS: %v", err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

// onShared is where most tests on the machine's Redis start: a client on it
// (sharedRedis), a context of 30 s and a key prefix of the test's own.
func onShared(t testing.TB) (*redis.Client, context.Context, string) {
	t.Helper()
	return sharedRedis(t), testenv.Context(t, 30*time.Second), testenv.Name("dislocktest-")
}

// newMiniredis starts a miniredis whose TTLs run on the real clock.
func newMiniredis(t testing.TB) *miniredis.Miniredis {
	t.Helper()
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true)
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

const redisServerBin = "redis-server"

// needBinary skips (or, under CI, fails) when name is not installed.
func needBinary(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if testenv.CI() {
			t.Fatalf("%s not installed", name)
		}
		t.Skipf("%s not installed", name)
	}
	return p
}

// privateRedis is a redis-server process owned by one test, without
// persistence, so a restart loses every key.
type privateRedis struct {
	t    testing.TB
	port int
	dir  string
	args []string
	cmd  *exec.Cmd
}

func (p *privateRedis) Addr() string { return "127.0.0.1:" + strconv.Itoa(p.port) }

func startPrivateRedis(t testing.TB, extra ...string) *privateRedis {
	t.Helper()
	needBinary(t, redisServerBin)
	p := &privateRedis{t: t, port: redistest.ClusterPort(t), dir: t.TempDir()}
	p.args = append([]string{"--port", strconv.Itoa(p.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", p.dir, "--protected-mode", "no"}, extra...)
	p.start()
	t.Cleanup(p.Stop)
	return p
}

// privateClient starts a private server and returns a client on it, closed
// when the test ends.
func privateClient(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: startPrivateRedis(t).Addr()})
	t.Cleanup(func() { c.Close() })
	return c
}

func (p *privateRedis) start() {
	p.t.Helper()
	cmd := exec.Command(redisServerBin, p.args...)
	cmd.Dir = p.dir
	log, err := os.Create(fmt.Sprintf("%s/redis-%d.log", p.dir, time.Now().UnixNano()))
	if err != nil {
		p.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("start redis-server: %v", err)
	}
	p.cmd = cmd
	go func() { cmd.Wait(); log.Close() }()
	waitPing(p.t, p.Addr())
}

// Stop kills the server.
func (p *privateRedis) Stop() {
	if p.cmd == nil {
		return
	}
	p.cmd.Process.Kill()
	// Wait for the port to close so a restart can bind it.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", p.Addr(), 100*time.Millisecond)
		if err != nil {
			break
		}
		c.Close()
		time.Sleep(10 * time.Millisecond)
	}
	p.cmd = nil
}

// Restart kills the server and starts it again on the same port: with no
// persistence, every key is gone.
func (p *privateRedis) Restart() {
	p.t.Helper()
	p.Stop()
	p.start()
}

func waitPing(t testing.TB, addr string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.SetDeadline(time.Now().Add(time.Second))
			fmt.Fprintf(c, "PING\r\n")
			line, _ := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if strings.HasPrefix(line, "+PONG") || strings.HasPrefix(line, "-NOAUTH") { // -NOAUTH: up, with a password
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server at %s did not start: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// clusterAddrs returns the seed addresses of a Redis Cluster:
// DISLOCK_TEST_REDIS_CLUSTER (comma-separated host:port) when set, otherwise
// a 3-master cluster of private redis-server processes on loopback ports,
// created with redis-cli --cluster create and stopped when t ends.
func clusterAddrs(t testing.TB) []string {
	t.Helper()
	if env := os.Getenv("DISLOCK_TEST_REDIS_CLUSTER"); env != "" {
		return strings.Split(env, ",")
	}
	cli := needBinary(t, "redis-cli")
	var addrs []string
	for range 3 {
		p := startPrivateRedis(t, "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000")
		addrs = append(addrs, p.Addr())
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.Command(cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		for {
			info, err := c.ClusterInfo(context.Background()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				c.Close()
				t.Fatalf("cluster node %s not ok: %v %s", a, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.Close()
	}
	return addrs
}
