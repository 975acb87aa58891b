package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgWalWriterDelay is the private server's wal_writer_delay (PostgreSQL's
// default, set explicitly): under WithAsyncCommit a crash may lose the
// commits of up to 3× this.
const pgWalWriterDelay = 200 * time.Millisecond

// pgServer is a private PostgreSQL server for crash tests: initdb into a
// temporary directory with the installed binaries, postgres on a free
// loopback port. initdb and postgres refuse to run as root, so when the
// tests do, both run as the postgres OS user. The server is stopped by PID
// (its process group) when the test ends.
type pgServer struct {
	t    testing.TB
	bin  string
	root string // owned by the server's user: data directory, socket, log
	data string
	port int
	cred *syscall.Credential
	child
}

// pgBinDir finds the newest installed PostgreSQL server binaries.
func pgBinDir() (string, error) {
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("PostgreSQL server binaries (initdb, postgres) not installed; scripts/services.sh installs them (apt-get install postgresql)")
}

// startPGServer initdbs and starts a private server, or skips (fails under
// CI=true) when the binaries are missing.
func startPGServer(t testing.TB) *pgServer {
	t.Helper()
	bin, err := pgBinDir()
	if err != nil {
		if ciMode() {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	root, err := os.MkdirTemp("", "dislock-chaos-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	s := &pgServer{t: t, bin: bin, root: root, data: filepath.Join(root, "data"), port: freePort(t)}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("initdb cannot run as root and there is no postgres user to run it as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(root, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", s.data, "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--no-sync", "--no-instructions")
	initdb.Dir = root
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	if out, err := runOutput(initdb); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.kill)
	return s
}

// url is the server's URL. It carries the sentinel password, which trust
// authentication ignores.
func (s *pgServer) url() string {
	return fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/postgres?sslmode=disable", sentinelPW, s.port)
}

func (s *pgServer) start() error {
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), "-D", s.data, "-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="+s.root,
		"-c", "max_connections=80", "-c", "shared_buffers=32MB",
		"-c", "wal_writer_delay="+strconv.Itoa(int(pgWalWriterDelay/time.Millisecond))+"ms")
	cmd.Dir = s.root
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Setpgid: true}
	if err := s.launch(cmd, filepath.Join(s.root, "postgres.log")); err != nil {
		return err
	}
	return s.waitReady(30 * time.Second)
}

// waitReady waits until the server answers a query (after a crash, once
// its recovery is done).
func (s *pgServer) waitReady(within time.Duration) error {
	return s.waitUp(within, 50*time.Millisecond, "postgres (log: "+filepath.Join(s.root, "postgres.log")+")", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, s.url())
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "SELECT 1")
		return err
	})
}

// crash kills the postmaster and every process of the server at once with
// SIGKILL, as a machine crash does (what was written to the OS survives,
// PostgreSQL's shared memory does not), and waits until they are gone.
func (s *pgServer) crash() {
	cmd, done := s.take()
	if cmd == nil {
		return
	}
	pid := cmd.Process.Pid
	_ = syscall.Kill(pid, syscall.SIGKILL)
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	<-done
	waitGroupGone(pid, 10*time.Second)
}

// stop shuts the server down cleanly (fast shutdown: SIGINT).
func (s *pgServer) stop() {
	cmd, done := s.take()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
	waitGroupGone(cmd.Process.Pid, 10*time.Second)
}

func (s *pgServer) kill() {
	s.crash()
}

// waitGroupGone waits until no live (non-zombie) process is left in
// process group pgid.
func waitGroupGone(pgid int, within time.Duration) {
	for deadline := time.Now().Add(within); time.Now().Before(deadline); {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		if !groupAlive(pgid) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func groupAlive(pgid int) bool {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return syscall.Kill(-pgid, 0) == nil
	}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces, so split
		// after its closing parenthesis.
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if g, _ := strconv.Atoi(f[2]); g == pgid {
			return true
		}
	}
	return false
}
