package pg_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dislock/dislock/internal/testenv"
	"github.com/jackc/pgx/v5"
)

// A private PgBouncer in transaction pooling mode, on a free loopback port,
// in front of DISLOCK_TEST_PG's server. scripts/pgbouncer.sh installs it.

// bouncer is a running pgbouncer.
type bouncer struct {
	url string              // connection URL through the pooler (no TLS)
	out *testenv.SyncBuffer // its log (stderr)
	cmd *exec.Cmd
}

// pgbouncerBin finds the pgbouncer binary, failing (CI) or skipping the test
// when it is missing.
func pgbouncerBin(t testing.TB) string {
	t.Helper()
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer"
	}
	msg := "pgbouncer is not installed; run scripts/pgbouncer.sh (apt-get install pgbouncer)"
	if testenv.CI() {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// startBouncer starts a pgbouncer (pool_mode = transaction) in front of
// the test server and stops it, by PID, at cleanup.
func startBouncer(t testing.TB) *bouncer {
	t.Helper()
	bin := pgbouncerBin(t)
	raw := testenv.PG(t)
	cc, err := pgx.ParseConfig(raw)
	if err != nil {
		t.Fatal("DISLOCK_TEST_PG cannot be parsed")
	}
	var lastErr error
	for range 3 { // the free port may be taken before pgbouncer binds it
		b, err := runBouncer(t, bin, cc)
		if err == nil {
			return b
		}
		lastErr = err
	}
	t.Fatalf("pgbouncer: %v", lastErr)
	return nil
}

func runBouncer(t testing.TB, bin string, cc *pgx.ConnConfig) (*bouncer, error) {
	dir := t.TempDir()
	port := testenv.FreePort(t)
	authType := "trust"
	if cc.Password != "" {
		authType = "md5" // the plain password in the auth file serves both sides
	}
	serverTLS := "disable"
	if cc.TLSConfig != nil {
		serverTLS = "require"
	}
	db := cc.Database
	if db == "" {
		db = cc.User
	}
	// The pooler's server connections commit without waiting for the WAL
	// flush, as the direct conformance pools do (noFlushWait): these
	// suites are about leases, and a checkpoint's fsync on a shared
	// machine outlasts the suite's 600ms TTL's renewals.
	// The test URL's run-time parameters (search_path) too, which the
	// pooler would not pass on from a client's start-up: set on each
	// server connection, dollar-quoted for the ini file's quotes.
	setup := "SET synchronous_commit = off"
	for _, k := range slices.Sorted(maps.Keys(cc.RuntimeParams)) {
		setup += fmt.Sprintf("; SELECT set_config($dislock$%s$dislock$, $dislock$%s$dislock$, false)", k, cc.RuntimeParams[k])
	}
	ini := fmt.Sprintf(`[databases]
%s = host=%s port=%d dbname=%s connect_query='%s'

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = %s
auth_file = %s
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 12
server_tls_sslmode = %s
ignore_startup_parameters = extra_float_digits
logfile =
pidfile =
`, quoteIni(db), cc.Host, cc.Port, quoteIni(db), setup, port, authType, filepath.Join(dir, "userlist.txt"), serverTLS)
	userlist := quoteAuth(cc.User) + " " + quoteAuth(cc.Password) + "\n"
	iniPath := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(iniPath, []byte(ini), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "userlist.txt"), []byte(userlist), 0o600); err != nil {
		return nil, err
	}
	args := []string{iniPath}
	if os.Geteuid() == 0 {
		// pgbouncer refuses to run as root: it switches to -u's user,
		// which must be able to read its files.
		u, err := user.Lookup("postgres")
		if err != nil {
			u, err = user.Lookup("nobody")
		}
		if err != nil {
			return nil, fmt.Errorf("running as root and no postgres or nobody user to run pgbouncer as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		for _, p := range []string{dir, iniPath, filepath.Join(dir, "userlist.txt")} {
			if err := os.Chown(p, uid, gid); err != nil {
				return nil, err
			}
		}
		args = []string{"-u", u.Username, iniPath}
	}
	out := &testenv.SyncBuffer{}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM) // immediate shutdown
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-exited:
			return nil, fmt.Errorf("exited at start: %s", out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("not listening after 10s: %s", out.String())
		}
	}
	t.Cleanup(stop)
	u := url.URL{Scheme: "postgres", Host: addr, Path: "/" + db, RawQuery: "sslmode=disable"}
	if cc.Password != "" {
		u.User = url.UserPassword(cc.User, cc.Password)
	} else {
		u.User = url.User(cc.User)
	}
	return &bouncer{url: u.String(), out: out, cmd: cmd}, nil
}

// quoteIni quotes a database name for pgbouncer's ini file.
func quoteIni(s string) string {
	if strings.ContainsAny(s, " =\"'") {
		return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
	}
	return s
}

// quoteAuth quotes a user name or password for pgbouncer's auth file.
func quoteAuth(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// throughPooler reports whether DISLOCK_TEST_PG itself goes through a
// transaction pooler: a LISTEN there does not receive a NOTIFY.
func throughPooler(t testing.TB) bool {
	t.Helper()
	pooled, err := pooledTarget(testenv.PG(t))
	if err != nil {
		t.Fatalf("probe DISLOCK_TEST_PG: %v", err)
	}
	return pooled
}

// testURL is DISLOCK_TEST_PG for pg.Open, with default_query_exec_mode=exec
// added when it goes through a transaction pooler.
func testURL(t testing.TB) string {
	t.Helper()
	raw := testenv.PG(t)
	if !throughPooler(t) {
		return raw
	}
	return testenv.PGParam(t, raw, "default_query_exec_mode", "exec")
}

// needDirect skips a test that needs a direct connection to the server
// (startup parameters, roles, application_name, a direct LISTEN) when
// DISLOCK_TEST_PG goes through a transaction pooler.
func needDirect(t testing.TB, why string) {
	t.Helper()
	if throughPooler(t) {
		t.Skip("DISLOCK_TEST_PG goes through a transaction pooler; this test needs a direct connection: " + why)
	}
}

var (
	pooledMu    sync.Mutex
	pooledCache = map[string]bool{}
)

func pooledTarget(raw string) (bool, error) {
	pooledMu.Lock()
	defer pooledMu.Unlock()
	if p, ok := pooledCache[raw]; ok {
		return p, nil
	}
	p, err := probePooled(raw)
	if err == nil {
		pooledCache[raw] = p
	}
	return p, err
}

func probePooled(raw string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cc, err := pgx.ParseConfig(raw)
	if err != nil {
		return false, errors.New("cannot parse the URL")
	}
	cc.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	listener, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return false, err
	}
	defer listener.Close(context.Background())
	notifier, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return false, err
	}
	defer notifier.Close(context.Background())
	ch := pgx.Identifier{testenv.Name("dislock_probe_")}.Sanitize()
	if _, err := listener.Exec(ctx, "LISTEN "+ch); err != nil {
		return false, err
	}
	if _, err := notifier.Exec(ctx, "NOTIFY "+ch); err != nil {
		return false, err
	}
	wait, stop := context.WithTimeout(ctx, 2*time.Second)
	defer stop()
	if _, err := listener.WaitForNotification(wait); err != nil {
		if wait.Err() != nil && ctx.Err() == nil {
			return true, nil
		}
		return false, err
	}
	return false, nil
}
