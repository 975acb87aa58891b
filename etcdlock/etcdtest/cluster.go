// Package etcdtest runs real etcd servers, embedded in the test process
// (go.etcd.io/etcd/server/v3/embed, the same version as the client), for
// dislock's etcd tests: one member or a cluster of several on loopback
// ports, with the faults those tests need — a member killed, restarted, or
// cut off from its peers.
//
// It is its own module so that the server's dependencies stay out of
// etcdlock's module graph. The servers tick every 10 ms with a 100 ms
// election timeout, so a cluster starts in about 100 ms and the shortest
// lease is 1 s.
package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/dislock/dislock/internal/testenv"
)

// Cluster is a set of embedded etcd members started by Start. Its methods
// are safe for concurrent use.
type Cluster struct {
	t       testing.TB
	token   string
	members []*Member
}

// Member is one embedded etcd server.
type Member struct {
	Name      string
	ClientURL string // http://127.0.0.1:port, through a proxy that Kill resets
	PeerURL   string
	dir       string
	initial   string
	listen    string // the server's own client URL
	front     *front

	mu      sync.Mutex
	e       *embed.Etcd
	stopped chan struct{} // closed when the last Close finished
}

// Start starts an n-member cluster on free loopback ports and stops it when
// t ends. It fails t if the cluster does not become ready within 20 s.
func Start(t testing.TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{t: t, token: fmt.Sprintf("dislock-%d", time.Now().UnixNano())}
	var initial []string
	for i := range n {
		listen := freeAddr(t)
		fr, err := newFront(listen)
		if err != nil {
			t.Fatalf("etcdtest: %v", err)
		}
		t.Cleanup(fr.close)
		m := &Member{
			Name:      "m" + strconv.Itoa(i),
			ClientURL: "http://" + fr.addr(),
			PeerURL:   "http://" + freeAddr(t),
			dir:       t.TempDir(),
			listen:    "http://" + listen,
			front:     fr,
		}
		initial = append(initial, m.Name+"="+m.PeerURL)
		c.members = append(c.members, m)
	}
	for _, m := range c.members {
		m.initial = strings.Join(initial, ",")
	}
	t.Cleanup(c.stop)
	// One after the other: a new member asks its peers whether it is
	// already part of the cluster, and waits a second for each peer whose
	// port is open but not yet served. Started in order, each finds the
	// earlier ones serving and the later ones' ports closed.
	started := make([]*embed.Etcd, n)
	for i, m := range c.members {
		e, err := embed.StartEtcd(c.config(m))
		if err != nil {
			t.Fatalf("etcdtest: start %s: %v", m.Name, err)
		}
		started[i] = e
		m.mu.Lock()
		m.e = e
		m.mu.Unlock()
	}
	for i, e := range started {
		if err := ready(e); err != nil {
			t.Fatalf("etcdtest: %s: %v", c.members[i].Name, err)
		}
	}
	return c
}

func ready(e *embed.Etcd) error {
	select {
	case <-e.Server.ReadyNotify():
		return nil
	case err := <-e.Err():
		return err
	case <-time.After(20 * time.Second):
		return errors.New("not ready within 20s")
	}
}

// freeAddr is a loopback address for a member to listen on, from ports
// that no outgoing connection takes while the member is down (see
// testenv.LoopbackPorts): a member killed and started again gets its port
// back.
func freeAddr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort(t)))
}

func (c *Cluster) config(m *Member) *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = m.Name
	cfg.Dir = m.dir
	cu, _ := url.Parse(m.listen)
	pu, _ := url.Parse(m.PeerURL)
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = m.initial
	cfg.InitialClusterToken = c.token
	cfg.TickMs, cfg.ElectionMs = 10, 100
	cfg.UnsafeNoFsync = true
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(debugLogger())
	return cfg
}

// start starts (or restarts, on its data directory) member m and waits
// until it serves.
func (c *Cluster) start(m *Member) error {
	e, err := embed.StartEtcd(c.config(m))
	if err != nil {
		return fmt.Errorf("start %s: %w", m.Name, err)
	}
	if err := ready(e); err != nil {
		e.Close()
		return fmt.Errorf("%s: %w", m.Name, err)
	}
	m.mu.Lock()
	m.e = e
	m.stopped = nil
	m.mu.Unlock()
	m.front.setDown(false)
	return nil
}

func (c *Cluster) stop() {
	var wg sync.WaitGroup
	for i := range c.members {
		wg.Go(func() { c.Kill(i); c.wait(i) })
	}
	wg.Wait()
}

// Size is the number of members.
func (c *Cluster) Size() int { return len(c.members) }

// Member returns member i.
func (c *Cluster) Member(i int) *Member { return c.members[i] }

// Endpoints returns the client URLs of members idx (all members when idx is
// empty).
func (c *Cluster) Endpoints(idx ...int) []string {
	if len(idx) == 0 {
		for i := range c.members {
			idx = append(idx, i)
		}
	}
	eps := make([]string, len(idx))
	for j, i := range idx {
		eps[j] = c.members[i].ClientURL
	}
	return eps
}

// DirectEndpoints returns the members' own client URLs, without the proxy
// that Kill resets (for benchmarks).
func (c *Cluster) DirectEndpoints() []string {
	eps := make([]string, len(c.members))
	for i, m := range c.members {
		eps[i] = m.listen
	}
	return eps
}

// URL returns the members idx (all when empty) as an etcd:// URL.
func (c *Cluster) URL(idx ...int) string {
	var hosts []string
	for _, ep := range c.Endpoints(idx...) {
		hosts = append(hosts, strings.TrimPrefix(ep, "http://"))
	}
	return "etcd://" + strings.Join(hosts, ",")
}

// Client returns a client on members idx (all when empty), closed when t
// ends.
func (c *Cluster) Client(t testing.TB, idx ...int) *clientv3.Client {
	t.Helper()
	return NewClient(t, clientv3.Config{Endpoints: c.Endpoints(idx...)})
}

// NewClient returns a client made from cfg, with a silent logger and a
// 5 s dial timeout unless cfg sets them, closed when t ends.
func NewClient(t testing.TB, cfg clientv3.Config) *clientv3.Client {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatalf("etcdtest: client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func (c *Cluster) server(i int) *embed.Etcd {
	m := c.members[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.e
}

// Applied returns the index of the last Raft entry member i applied: it
// grows by one for every proposal the cluster commits (a write, a lease
// grant or revoke) and not for reads or lease keepalives. It is 0 when the
// member is down.
func (c *Cluster) Applied(i int) uint64 {
	e := c.server(i)
	if e == nil {
		return 0
	}
	return e.Server.AppliedIndex()
}

// Leader returns the index of the member that is leader, waiting up to 10 s
// for the live members to agree on one.
func (c *Cluster) Leader() int {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		ids := map[uint64]int{}
		lead := uint64(0)
		agree := true
		for i := range c.members {
			e := c.server(i)
			if e == nil {
				continue
			}
			ids[uint64(e.Server.MemberID())] = i
			l := uint64(e.Server.Leader())
			if lead == 0 {
				lead = l
			} else if l != lead {
				agree = false
			}
		}
		if i, ok := ids[lead]; ok && agree && lead != 0 {
			return i
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.t.Fatal("etcdtest: no leader within 10s")
	return -1
}

// Kill stops member i at once, without handing over leadership, as a crash
// would: raft stops, and its clients' connections are reset and new ones
// refused. It returns without waiting for the server to wind down (etcd
// waits up to 5 s for open streams); Restart and the cluster's cleanup
// wait.
func (c *Cluster) Kill(i int) {
	m := c.members[i]
	m.mu.Lock()
	e := m.e
	m.e = nil
	if e == nil {
		m.mu.Unlock()
		return
	}
	done := make(chan struct{})
	m.stopped = done
	m.mu.Unlock()
	e.Server.HardStop()
	m.front.setDown(true) // clients' connections reset, as by a crash
	go func() {
		defer close(done)
		e.Close()
	}()
}

func (c *Cluster) wait(i int) {
	m := c.members[i]
	m.mu.Lock()
	done := m.stopped
	m.mu.Unlock()
	if done != nil {
		<-done
	}
}

// Restart kills member i if it runs and starts it again on its data
// directory and ports.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	c.Kill(i)
	c.wait(i)
	if err := c.start(c.members[i]); err != nil {
		c.t.Fatalf("etcdtest: restart: %v", err)
	}
}

// CutClients resets the connections of member i's clients (through
// ClientURL) and refuses new ones, the member running: a cut between the
// clients and the member. MendClients lets them connect again.
func (c *Cluster) CutClients(i int) { c.members[i].front.setDown(true) }

// MendClients undoes CutClients(i).
func (c *Cluster) MendClients(i int) { c.members[i].front.setDown(false) }

// Partition cuts member i off from every other member, in both directions.
// Its clients still reach it.
func (c *Cluster) Partition(i int) { c.cut(i, true) }

// Heal undoes Partition(i).
func (c *Cluster) Heal(i int) { c.cut(i, false) }

func (c *Cluster) cut(i int, cut bool) {
	ei := c.server(i)
	if ei == nil {
		return
	}
	for j := range c.members {
		ej := c.server(j)
		if j == i || ej == nil {
			continue
		}
		if cut {
			ei.Server.CutPeer(ej.Server.MemberID())
			ej.Server.CutPeer(ei.Server.MemberID())
		} else {
			ei.Server.MendPeer(ej.Server.MemberID())
			ej.Server.MendPeer(ei.Server.MemberID())
		}
	}
}

// Shared returns the URL in DISLOCK_TEST_ETCD when it is set, after checking
// that its first endpoint accepts connections (failing under CI=true and
// skipping otherwise when it does not), and "" when it is not set.
func Shared(t testing.TB) string {
	t.Helper()
	raw := os.Getenv("DISLOCK_TEST_ETCD")
	if raw == "" {
		return ""
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal("DISLOCK_TEST_ETCD is not a valid URL")
	}
	host := strings.Split(u.Host, ",")[0]
	if _, _, err := net.SplitHostPort(host); err != nil {
		host = net.JoinHostPort(host, "2379")
	}
	conn, err := net.DialTimeout("tcp", host, 3*time.Second)
	if err != nil {
		msg := fmt.Sprintf("DISLOCK_TEST_ETCD: server at %s not reachable (%v)", host, err)
		if ci := strings.ToLower(os.Getenv("CI")); ci == "true" || ci == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	conn.Close()
	return raw
}

// URL is the etcd:// URL of the server t runs on: DISLOCK_TEST_ETCD when
// it is set (Shared), otherwise a private one-member cluster's, stopped when
// t ends.
func URL(t testing.TB) string {
	t.Helper()
	if u := Shared(t); u != "" {
		return u
	}
	return Start(t, 1).URL()
}

// WaitHealthy waits until a linearizable read through cli succeeds.
func WaitHealthy(t testing.TB, cli *clientv3.Client, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		_, err := cli.Get(clientv3.WithRequireLeader(ctx), "health")
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcdtest: cluster not healthy within %v: %v", within, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func debugLogger() *zap.Logger {
	if os.Getenv("ETCDTEST_LOG") != "" {
		l, _ := zap.NewDevelopment()
		return l
	}
	return zap.NewNop()
}
