package chaos

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Server URLs, as in the main module's internal/testenv (which a nested
// module cannot import): DISLOCK_TEST_PG and DISLOCK_TEST_REDIS with local
// defaults; an unreachable server fails the test under CI=true and skips it
// elsewhere.
const (
	defaultPG    = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	defaultRedis = "redis://127.0.0.1:6379/0"
)

func ciMode() bool {
	v := strings.ToLower(os.Getenv("CI"))
	return v == "true" || v == "1"
}

// serverURL reads env (default def) and dials the server once.
func serverURL(env, def, port string) (*url.URL, error) {
	raw := os.Getenv(env)
	if raw == "" {
		raw = def
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%s is not a valid URL", env)
	}
	if u.Port() == "" {
		u.Host = net.JoinHostPort(u.Hostname(), port)
	}
	if err := loopback(u.Host); err != nil {
		return nil, fmt.Errorf("%s: the chaos suite only runs against loopback servers", env)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 3*time.Second)
	if err != nil {
		return nil, fmt.Errorf("%s: server at %s not reachable (%v); run scripts/test.sh, which starts it", env, u.Host, err)
	}
	conn.Close()
	return u, nil
}

func needServer(t testing.TB, env, def, port string) *url.URL {
	t.Helper()
	u, err := serverURL(env, def, port)
	if err != nil {
		if ciMode() {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	return u
}

func pgURL(t testing.TB) *url.URL { return needServer(t, "DISLOCK_TEST_PG", defaultPG, "5432") }
func redisURL(t testing.TB) *url.URL {
	return needServer(t, "DISLOCK_TEST_REDIS", defaultRedis, "6379")
}

// viaProxy returns u with its host replaced by the proxy's address and the
// password set to pass.
func viaProxy(u *url.URL, addr, user, pass string) string {
	c := *u
	c.Host = addr
	if user == "" && u.User != nil {
		user = u.User.Username()
	}
	c.User = url.UserPassword(user, pass)
	return c.String()
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// redisServer is a private redis-server on a free loopback port, without
// persistence: a restart empties it, and pausing it disturbs no one else.
type redisServer struct {
	t    testing.TB
	port int
	pass string
	dir  string
	cmd  *exec.Cmd
}

// startRedis starts a private redis-server, or returns nil when the binary
// is missing.
func startRedis(t testing.TB, pass string) *redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil
	}
	r := &redisServer{t: t, port: freePort(t), pass: pass, dir: t.TempDir()}
	if err := r.start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	t.Cleanup(r.kill)
	return r
}

func (r *redisServer) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

func (r *redisServer) start() error {
	args := []string{"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", r.dir, "--logfile", filepath.Join(r.dir, "redis.log")}
	if r.pass != "" {
		args = append(args, "--requirepass", r.pass)
	}
	cmd := exec.Command("redis-server", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	r.cmd = cmd
	for range 100 {
		if c, err := net.DialTimeout("tcp", r.addr(), 100*time.Millisecond); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("redis-server did not listen on %s", r.addr())
}

// kill stops the server at once (SIGKILL): everything it held is gone.
func (r *redisServer) kill() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
	r.cmd = nil
}
