// Package zktest runs private ZooKeeper servers for dislock's tests: a
// standalone server or an ensemble on free loopback ports, from the Debian
// zookeeper package (ZooKeeper 3.8 on Java 17), without systemd. Servers use
// tickTime=100 so that sessions as short as 200 ms are allowed. They are
// stopped by PID.
package zktest

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dislock/dislock/internal/testenv"
)

// ClassPath is where the Debian package installs the server.
const ClassPath = "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar"

// simpleLogger is SLF4J's simple binding (Debian's libslf4j-java, which the
// zookeeper package pulls in). With it on the class path a server logs its
// warnings and its quorum state changes to zk.log; without it, SLF4J
// falls back to logging nothing.
const simpleLogger = "/usr/share/java/slf4j-simple.jar"

// logFlags make the server log what explains a stalled ensemble: warnings,
// and the quorum peer's state changes (elections, leading, following). Two
// classes warn about every client connection (an "old client" without the
// read-only flag, a socket closed without a closeSession): errors only.
var logFlags = []string{
	"-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
	"-Dorg.slf4j.simpleLogger.log.org.apache.zookeeper.server.quorum.QuorumPeer=info",
	"-Dorg.slf4j.simpleLogger.log.org.apache.zookeeper.server.ZooKeeperServer=error",
	"-Dorg.slf4j.simpleLogger.log.org.apache.zookeeper.server.NIOServerCnxn=error",
	"-Dorg.slf4j.simpleLogger.showDateTime=true",
	"-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
}

// ErrNotInstalled says java or the zookeeper package is missing.
var ErrNotInstalled = errors.New("zktest: ZooKeeper server not installed (apt-get install zookeeper; scripts/zookeeper.sh does it)")

// Installed reports whether a server can be started here.
func Installed() error {
	if _, err := exec.LookPath("java"); err != nil {
		return ErrNotInstalled
	}
	if _, err := os.Stat("/usr/share/java/zookeeper.jar"); err != nil {
		return ErrNotInstalled
	}
	return nil
}

// Node is one server process of an Ensemble.
type Node struct {
	ID         int
	ClientPort int
	peerPort   int
	electPort  int
	dir        string

	mu  sync.Mutex
	cmd *exec.Cmd
	log *os.File
}

// Addr is the node's client address.
func (n *Node) Addr() string { return "127.0.0.1:" + strconv.Itoa(n.ClientPort) }

// PID is the server's process ID, 0 when it is not running.
func (n *Node) PID() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return 0
	}
	return n.cmd.Process.Pid
}

// Ensemble is a set of servers (one for standalone).
type Ensemble struct {
	Nodes []*Node
	dir   string
	stock bool // the session limits of a stock server
}

// Start starts n servers (n = 1: standalone) under dir and waits until every
// one of them serves (its srvr output has a Mode line), at most timeout.
func Start(dir string, n int, timeout time.Duration) (*Ensemble, error) {
	return start(&Ensemble{dir: dir}, n, timeout)
}

// StartStock starts a standalone server with the session limits of a stock
// install (tickTime 2000: sessions of 4 s to 40 s), waiting at most timeout.
func StartStock(dir string, timeout time.Duration) (*Ensemble, error) {
	return start(&Ensemble{dir: dir, stock: true}, 1, timeout)
}

func start(e *Ensemble, n int, timeout time.Duration) (*Ensemble, error) {
	if err := Installed(); err != nil {
		return nil, err
	}
	ports, err := testenv.LoopbackPorts(3 * n)
	if err != nil {
		return nil, err
	}
	for i := range n {
		e.Nodes = append(e.Nodes, &Node{ID: i + 1, ClientPort: ports[3*i], peerPort: ports[3*i+1], electPort: ports[3*i+2],
			dir: filepath.Join(e.dir, "zk"+strconv.Itoa(i+1))})
	}
	for _, node := range e.Nodes {
		if err := e.writeConfig(node); err != nil {
			return nil, err
		}
		if err := node.start(); err != nil {
			e.Stop()
			return nil, err
		}
	}
	if err := e.WaitServing(timeout); err != nil {
		e.Stop()
		return nil, err
	}
	return e, nil
}

func (e *Ensemble) writeConfig(n *Node) error {
	data := filepath.Join(n.dir, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		return err
	}
	var b strings.Builder
	if e.stock {
		fmt.Fprintf(&b, "tickTime=2000\ninitLimit=10\nsyncLimit=5\n")
	} else {
		fmt.Fprintf(&b, "tickTime=100\ninitLimit=20\nsyncLimit=10\nminSessionTimeout=200\nmaxSessionTimeout=120000\n")
	}
	fmt.Fprintf(&b, "dataDir=%s\nclientPortAddress=127.0.0.1\nclientPort=%d\n", data, n.ClientPort)
	fmt.Fprintf(&b, "admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr,mntr,stat\nforceSync=no\n")
	if len(e.Nodes) > 1 {
		for _, o := range e.Nodes {
			fmt.Fprintf(&b, "server.%d=127.0.0.1:%d:%d\n", o.ID, o.peerPort, o.electPort)
		}
		if err := os.WriteFile(filepath.Join(data, "myid"), []byte(strconv.Itoa(n.ID)+"\n"), 0o644); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(n.dir, "zoo.cfg"), []byte(b.String()), 0o644)
}

func (n *Node) start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		return nil
	}
	log, err := os.OpenFile(filepath.Join(n.dir, "zk.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	args := []string{"-Xmx192m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto"}
	cp := ClassPath
	if _, err := os.Stat(simpleLogger); err == nil {
		cp += ":" + simpleLogger
		args = append(args, logFlags...)
	}
	args = append(args, "-cp", cp, "org.apache.zookeeper.server.quorum.QuorumPeerMain", filepath.Join(n.dir, "zoo.cfg"))
	cmd := exec.Command("java", args...)
	cmd.Dir = n.dir
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("zktest: start java: %w", err)
	}
	n.cmd, n.log = cmd, log
	return nil
}

// Kill stops the node's server with SIGKILL and waits for it to exit.
func (n *Node) Kill() {
	n.mu.Lock()
	cmd, log := n.cmd, n.log
	n.cmd, n.log = nil, nil
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Kill()
	cmd.Wait() // no goroutine waits for the process: leak checks stay clean
	log.Close()
}

// Restart starts a killed node again, keeping its data.
func (n *Node) Restart() error { return n.start() }

// Mode is the node's srvr Mode ("leader", "follower", "standalone"), or ""
// when it does not serve.
func (n *Node) Mode() string {
	out, err := FourLetter(n.Addr(), "srvr")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(out, "\n") {
		if m, ok := strings.CutPrefix(line, "Mode: "); ok {
			return strings.TrimSpace(m)
		}
	}
	return ""
}

// FourLetter sends a four-letter command and returns the answer.
func FourLetter(addr, cmd string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte(cmd)); err != nil {
		return "", err
	}
	var b strings.Builder
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		b.WriteString(line)
		if err != nil {
			break
		}
	}
	return b.String(), nil
}

// WaitServing waits until every running node reports a Mode.
func (e *Ensemble) WaitServing(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ok := true
		for _, n := range e.Nodes {
			if n.PID() != 0 && n.Mode() == "" {
				ok = false
				break
			}
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("zktest: servers not serving after %v (logs in %s)", timeout, e.dir)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Leader returns the node in leader mode (or the standalone one), nil if
// none.
func (e *Ensemble) Leader() *Node {
	for _, n := range e.Nodes {
		if m := n.Mode(); m == "leader" || m == "standalone" {
			return n
		}
	}
	return nil
}

// Servers is the client address of every node.
func (e *Ensemble) Servers() []string {
	s := make([]string, len(e.Nodes))
	for i, n := range e.Nodes {
		s[i] = n.Addr()
	}
	return s
}

// Connect is the connect string "host:port,host:port...".
func (e *Ensemble) Connect() string { return strings.Join(e.Servers(), ",") }

// LogTail is the last n lines of each node's log, headed by the node's ID,
// for a failed test to print: a quorum that was lost and elected again
// shows there.
func (e *Ensemble) LogTail(n int) string {
	var b strings.Builder
	for _, node := range e.Nodes {
		data, err := os.ReadFile(filepath.Join(node.dir, "zk.log"))
		if err != nil {
			fmt.Fprintf(&b, "zk%d: %v\n", node.ID, err)
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		fmt.Fprintf(&b, "zk%d (%s), last %d of %d log lines:\n", node.ID, node.Addr(), min(n, len(lines)), len(lines))
		for _, l := range lines[max(0, len(lines)-n):] {
			fmt.Fprintf(&b, "  %s\n", l)
		}
	}
	return b.String()
}

// Stop kills every node.
func (e *Ensemble) Stop() {
	for _, n := range e.Nodes {
		n.Kill()
	}
}
