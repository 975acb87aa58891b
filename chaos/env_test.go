package chaos

import (
	"bytes"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/dislock/dislock/internal/deathsig"
	"github.com/dislock/dislock/internal/testenv"
)

// Server URLs, as in the main module's internal/testenv, but only on
// loopback: DISLOCK_TEST_PG and DISLOCK_TEST_REDIS with local defaults; an
// unreachable server fails the test under CI=true and skips it elsewhere.
const (
	defaultPG    = testenv.DefaultPG
	defaultRedis = testenv.DefaultRedis
)

func ciMode() bool { return testenv.CI() }

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

func freePort(t testing.TB) int { return testenv.FreePort(t) }

// addProxy puts a proxy named name in front of upstream (Harness.Add),
// failing t when it cannot.
func addProxy(t testing.TB, h *Harness, name, upstream string) *Proxy {
	t.Helper()
	px, err := h.Add(name, upstream)
	if err != nil {
		t.Fatal(err)
	}
	return px
}

// startRedis starts a private redis-server on a free loopback port,
// without persistence (a restart empties it, and pausing it disturbs no one
// else), with password pass; or returns nil when the binary is missing.
func startRedis(t testing.TB, pass string) *redisProc {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil
	}
	return startRedisProc(t, freePort(t), "--requirepass", pass)
}

// child is a server process a test started, waited for by one goroutine
// and stopped by PID.
type child struct {
	mu   sync.Mutex
	cmd  *exec.Cmd
	done <-chan error // gives Wait's result, then is closed, when the process has exited
}

// launch starts cmd with its output appended to the file logPath (a file,
// not a writer: os/exec starts no copying goroutines), with SIGKILL as its
// parent-death signal, so that no server outlives a test process that
// crashed or timed out (see deathsig.Start).
func (c *child) launch(cmd *exec.Cmd, logPath string) error {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	waited, err := deathsig.Start(cmd)
	if err != nil {
		return fmt.Errorf("start %s: %w", filepath.Base(cmd.Path), err)
	}
	c.mu.Lock()
	c.cmd, c.done = cmd, waited
	c.mu.Unlock()
	return nil
}

// runOutput runs cmd to its end, as CombinedOutput does, with SIGKILL as
// its parent-death signal (see deathsig.Start).
func runOutput(cmd *exec.Cmd) ([]byte, error) {
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	waited, err := deathsig.Start(cmd)
	if err != nil {
		return nil, err
	}
	err = <-waited
	return out.Bytes(), err
}

// exited gives Wait's result and is then closed, when the process last
// launched has exited.
func (c *child) exited() <-chan error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done
}

// waitUp calls up every interval until it reports the process ready, and
// fails when the process exits first or within passes; what names the
// process (and where its log is) in the error.
func (c *child) waitUp(within, interval time.Duration, what string, up func() error) error {
	done := c.exited()
	for deadline := time.Now().Add(within); ; {
		err := up()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("%s exited at start", what)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready within %v: %v", what, within, err)
		}
		time.Sleep(interval)
	}
}

// kill sends SIGKILL and waits for the process to end; it returns the
// process, nil when none ran.
func (c *child) kill() *exec.Cmd {
	cmd, done := c.take()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Kill()
	<-done
	return cmd
}

// take returns the running process and its done channel, to stop it, and
// forgets them; cmd is nil when none runs.
func (c *child) take() (cmd *exec.Cmd, done <-chan error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cmd, done = c.cmd, c.done
	c.cmd = nil
	return cmd, done
}
