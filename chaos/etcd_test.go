package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/etcdlock"
	"github.com/dislock/dislock/internal/testenv"
)

// etcdMemberEnv, set in a child process's environment, makes the test
// binary run one embedded etcd server instead of the tests:
// "datadir,client-addr,peer-addr". The chaos runs use a server in a
// process of its own so that it can be killed with SIGKILL, and so that
// its goroutines are not the run's.
const etcdMemberEnv = "DISLOCK_CHAOS_ETCD_MEMBER"

// etcdMemberMain runs the server when etcdMemberEnv is set, until its
// standard input closes (the test process ended) or it is killed. It
// reports false when the variable is not set.
func etcdMemberMain() bool {
	spec := os.Getenv(etcdMemberEnv)
	if spec == "" {
		return false
	}
	parts := strings.Split(spec, ",")
	if len(parts) != 3 {
		fmt.Fprintln(os.Stderr, "bad", etcdMemberEnv)
		os.Exit(2)
	}
	cfg := embed.NewConfig()
	cfg.Name = "chaos"
	cfg.Dir = parts[0]
	cu := url.URL{Scheme: "http", Host: parts[1]}
	pu := url.URL{Scheme: "http", Host: parts[2]}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.TickMs, cfg.ElectionMs = 10, 100
	cfg.UnsafeNoFsync = true // a killed process leaves its writes in the page cache
	cfg.BcryptCost = 4       // bcrypt.MinCost: authentication stays cheap under -race
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "start etcd:", err)
		os.Exit(1)
	}
	select {
	case <-e.Server.ReadyNotify():
		if err := os.WriteFile(filepath.Join(cfg.Dir, "ready"), nil, 0o600); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	case err := <-e.Err():
		fmt.Fprintln(os.Stderr, "etcd:", err)
		os.Exit(1)
	}
	go func() {
		_, _ = bufio.NewReader(os.Stdin).ReadString(0) // EOF: the parent is gone
		e.Close()
		os.Exit(0)
	}()
	fmt.Fprintln(os.Stderr, "etcd:", <-e.Err())
	os.Exit(1)
	return true
}

// etcdMember is a private etcd server in a child process, stopped by PID
// when the test ends.
type etcdMember struct {
	t      testing.TB
	dir    string
	client string // host:port
	peer   string
	stdin  *os.File // the child ends when it is closed
	child
}

func startEtcdMember(t testing.TB) *etcdMember {
	t.Helper()
	m := &etcdMember{t: t, dir: t.TempDir(), client: freeAddr(t), peer: freeAddr(t)}
	if err := m.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.kill)
	return m
}

func freeAddr(t testing.TB) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))
}

func (m *etcdMember) start() error {
	readyFile := filepath.Join(m.dir, "ready")
	_ = os.Remove(readyFile)
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), etcdMemberEnv+"="+m.dir+","+m.client+","+m.peer)
	cmd.Stdin = r
	m.mu.Lock()
	m.stdin = w
	m.mu.Unlock()
	if err := m.launch(cmd, filepath.Join(m.dir, "member.log")); err != nil {
		w.Close()
		return fmt.Errorf("etcd member: %w", err)
	}
	err = m.waitUp(20*time.Second, 10*time.Millisecond, "etcd member (log in "+m.dir+")", func() error {
		_, err := os.Stat(readyFile)
		return err
	})
	if err != nil {
		m.kill()
	}
	return err
}

// kill sends SIGKILL to the server process and waits for it.
func (m *etcdMember) kill() {
	if m.child.kill() == nil {
		return
	}
	m.mu.Lock()
	m.stdin.Close()
	m.mu.Unlock()
}

// etcdLogger writes the etcd client's warnings into libLogs, which the
// secret sweep searches.
func etcdLogger() *zap.Logger {
	enc := zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig())
	return zap.New(zapcore.NewCore(enc, zapcore.AddSync(libLogs), zapcore.WarnLevel))
}

// etcdSetup runs the contenders on a private etcd server (embedded
// go.etcd.io/etcd/server/v3 in a child process) with authentication on:
// user root, the sentinel password, which every contender's etcd:// URL
// carries. Its own fault: the server is killed with SIGKILL and restarted
// from its data directory.
func etcdSetup(t *testing.T, h *Harness, keys []string, prefix string) *backendEnv {
	m := startEtcdMember(t)
	direct := func(user, pass string) (*clientv3.Client, error) {
		return clientv3.New(clientv3.Config{Endpoints: []string{"http://" + m.client}, DialTimeout: 5 * time.Second,
			Username: user, Password: pass, Logger: etcdLogger()})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	{
		cli, err := direct("", "")
		if err != nil {
			t.Fatal(err)
		}
		_, err1 := cli.UserAdd(ctx, "root", sentinelPW)
		_, err2 := cli.UserGrantRole(ctx, "root", "root")
		_, err3 := cli.AuthEnable(ctx)
		cli.Close()
		if err := errors.Join(err1, err2, err3); err != nil {
			t.Fatalf("enable authentication: %v", err)
		}
	}
	px := addProxy(t, h, "etcd", m.client)
	eprefix := "dislock-chaos/" + strings.TrimSuffix(prefix, "-") + "/"
	adminCli, err := direct("root", sentinelPW)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := etcdlock.New(adminCli, etcdlock.WithPrefix(eprefix))
	if err != nil {
		t.Fatal(err)
	}
	env := &backendEnv{name: "etcd", proxy: px, admin: admin, keyPrefix: prefix}
	closeReg := withRegister(t, env, keys)
	proxied := func() (*clientv3.Client, error) {
		cfg, err := etcdlock.ParseURL("etcd://root:" + sentinelPW + "@" + px.Addr())
		if err != nil {
			return nil, err
		}
		cfg.DialTimeout = 3 * time.Second
		cfg.Logger = etcdLogger()
		return clientv3.New(cfg)
	}
	env.newLocker = func(ctx context.Context, opts ...core.ClientOption) (core.Locker, func() error, error) {
		cli, err := proxied()
		if err != nil {
			return nil, nil, err
		}
		l, err := etcdlock.New(cli, etcdlock.WithPrefix(eprefix), etcdlock.WithClientOptions(opts...))
		if err != nil {
			cli.Close()
			return nil, nil, err
		}
		return l, func() error { err := l.Close(); return errors.Join(err, cli.Close()) }, nil
	}
	env.deleteKeys = func(ctx context.Context, keys []string) ([]removal, error) {
		var out []removal
		for _, k := range keys {
			// The lock and a semaphore's permits (<prefix><key> NUL <owner
			// token>) in one transaction, so at one revision: every grant
			// after it gets a larger mod revision, its fencing token.
			sent := time.Now()
			resp, err := adminCli.Txn(ctx).Then(
				clientv3.OpDelete(eprefix+k, clientv3.WithPrevKV()),
				clientv3.OpDelete(eprefix+k+"\x00", clientv3.WithPrefix(), clientv3.WithPrevKV()),
			).Commit()
			if err != nil {
				return out, err
			}
			rm := removal{key: k, sent: sent, done: time.Now(), pos: uint64(resp.Header.Revision)}
			for _, op := range resp.Responses {
				for _, kv := range op.GetResponseDeleteRange().GetPrevKvs() {
					rm.tokens = append(rm.tokens, uint64(kv.ModRevision))
				}
			}
			out = append(out, rm)
		}
		return out, nil
	}
	probe, err := proxied()
	if err != nil {
		t.Fatal(err)
	}
	env.probe = func(ctx context.Context) error {
		_, err := probe.Get(clientv3.WithRequireLeader(ctx), eprefix+"probe")
		return err
	}
	env.faults = []faultDef{killRestart("etcd-kill-restart", false, m.kill, func() error {
		if err := m.start(); err != nil {
			return err
		}
		return awaitEtcd(adminCli, eprefix+"probe", 30*time.Second)
	})}
	env.close = func() {
		_ = admin.Close()
		_ = adminCli.Close()
		_ = probe.Close()
		closeReg()
	}
	return env
}

// awaitEtcd returns once cli, the harness's own client (not through the
// proxy), answers a read again after a restart: its connection may still
// wait out gRPC's reconnect backoff, and a delete-locks fault drawn right
// after the restart must not fail for it (as awaitSession on ZooKeeper).
func awaitEtcd(cli *clientv3.Client, key string, timeout time.Duration) error {
	var err error
	testenv.WaitFor(timeout, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = cli.Get(clientv3.WithRequireLeader(ctx), key)
		return err == nil
	})
	if err != nil {
		return fmt.Errorf("the harness's etcd client after the restart: %w", err)
	}
	return nil
}

func TestChaosEtcd(t *testing.T) {
	chaosSeeds(t, etcdSetup)
}
