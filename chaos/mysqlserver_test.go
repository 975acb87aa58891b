package chaos

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// mysqlServer is a private MariaDB (or MySQL) server for the chaos and
// crash tests: mariadb-install-db into a temporary directory, mariadbd on a
// free loopback port with its socket and log there, root's password the
// sentinel. Commits are durable (innodb_flush_log_at_trx_commit=1, the
// default, set explicitly). The server is killed by PID when the test
// ends. Its process is waited for synchronously, so it leaves no goroutine.
type mysqlServer struct {
	t      testing.TB
	bin    string
	dir    string
	data   string
	port   int
	asRoot bool

	child
}

// mysqlBins finds mariadb-install-db and the server binary.
func mysqlBins() (install, server string, err error) {
	for _, n := range []string{"mariadb-install-db", "mysql_install_db"} {
		if p, err := exec.LookPath(n); err == nil {
			install = p
			break
		}
	}
	for _, p := range []string{"mariadbd", "/usr/sbin/mariadbd", "mysqld", "/usr/sbin/mysqld"} {
		if q, err := exec.LookPath(p); err == nil {
			server = q
			break
		}
	}
	if install == "" || server == "" {
		return "", "", errors.New("MariaDB server binaries (mariadb-install-db, mariadbd) not installed; scripts/services.sh installs them (apt-get install mariadb-server)")
	}
	return install, server, nil
}

// startMySQLServer installs and starts a private server, or returns nil
// (required: skips, or fails under CI=true) when the binaries are missing.
func startMySQLServer(t testing.TB, required bool) *mysqlServer {
	t.Helper()
	install, bin, err := mysqlBins()
	if err != nil {
		if ciMode() {
			t.Fatal(err)
		}
		if required {
			t.Skip(err)
		}
		return nil
	}
	dir, err := os.MkdirTemp("", "dislock-chaos-mysql-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	s := &mysqlServer{t: t, bin: bin, dir: dir, data: filepath.Join(dir, "data"), port: freePort(t), asRoot: os.Geteuid() == 0}
	args := append([]string{"--no-defaults", "--datadir=" + s.data, "--auth-root-authentication-method=normal",
		"--skip-test-db"}, s.serverArgs()...)
	cmd := exec.Command(install, args...)
	cmd.Dir = dir
	if out, err := runOutput(cmd); err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.crash)
	// root's password becomes the sentinel (the secret sweeps look for it),
	// and the tests' database exists.
	setup := s.config("")
	setup.DBName = ""
	db := s.open(setup)
	defer db.Close()
	for _, q := range []string{"CREATE DATABASE IF NOT EXISTS test",
		"SET PASSWORD = PASSWORD('" + sentinelPW + "')"} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("set the private server up: %v", err)
		}
	}
	return s
}

// serverArgs are the options of the install and of every start: small
// logs and buffers, the loopback port, the socket in the directory.
func (s *mysqlServer) serverArgs() []string {
	args := []string{"--skip-name-resolve", "--innodb-log-file-size=8M", "--innodb-buffer-pool-size=32M"}
	if s.asRoot {
		args = append(args, "--user=root")
	}
	return args
}

func (s *mysqlServer) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// config is the driver's configuration for the server, at addr (the
// server's own address when empty), as root with password pass.
func (s *mysqlServer) config(pass string) *mysql.Config {
	c := mysql.NewConfig()
	c.User, c.Passwd, c.Net, c.Addr, c.DBName = "root", pass, "tcp", s.addr(), "test"
	c.Timeout = time.Second
	return c
}

func (s *mysqlServer) open(c *mysql.Config) *sql.DB {
	conn, err := mysql.NewConnector(c)
	if err != nil {
		s.t.Fatal(err)
	}
	return sql.OpenDB(conn)
}

func (s *mysqlServer) start() error {
	args := append([]string{"--no-defaults", "--datadir=" + s.data, "--port=" + strconv.Itoa(s.port),
		"--bind-address=127.0.0.1", "--socket=" + filepath.Join(s.dir, "mysqld.sock"),
		"--pid-file=" + filepath.Join(s.dir, "mysqld.pid"), "--innodb-flush-log-at-trx-commit=1",
		"--max-connections=200"}, s.serverArgs()...)
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.dir
	if err := s.launch(cmd, filepath.Join(s.dir, "mariadbd.log")); err != nil {
		return err
	}
	return s.waitReady(30 * time.Second)
}

// waitReady waits until the server answers (after a crash, once its
// recovery is done).
func (s *mysqlServer) waitReady(within time.Duration) error {
	c := s.config(sentinelPW)
	c.DBName = "" // not yet created at the first start
	return s.waitUp(within, 50*time.Millisecond, "mariadbd (log: "+filepath.Join(s.dir, "mariadbd.log")+")", func() error {
		var err error
		for _, pass := range []string{sentinelPW, ""} { // before and after the set-up
			c.Passwd = pass
			db := s.open(c)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err = db.PingContext(ctx)
			cancel()
			db.Close()
			if err == nil {
				return nil
			}
		}
		return err
	})
}

// crash kills the server with SIGKILL, as a machine crash does (what was
// written to the OS survives, the buffer pool does not), and waits for it.
func (s *mysqlServer) crash() { s.kill() }
