// Package testenv finds the servers dislock's tests run against, and holds
// the checks the backends' Open functions share (secret.go).
//
// Tests read DISLOCK_TEST_PG, DISLOCK_TEST_REDIS and DISLOCK_TEST_MYSQL
// (URLs; for MySQL also a go-sql-driver DSN) with local defaults. When a server does not answer, a test fails under CI (CI=true)
// and is skipped elsewhere, with a message saying how to start it.
package testenv

import (
	"crypto/rand"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"
)

// Default server URLs.
const (
	DefaultPG    = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	DefaultRedis = "redis://127.0.0.1:6379/0"
	DefaultMySQL = "mysql://root@127.0.0.1:3306/test"
)

// PG returns the PostgreSQL URL for tests, failing (CI) or skipping the test
// when the server does not accept connections. DISLOCK_TEST_PG may also be
// a keyword/value connection string ("host=… user=… dbname=…").
func PG(t testing.TB) string {
	t.Helper()
	raw := os.Getenv("DISLOCK_TEST_PG")
	if raw == "" || strings.Contains(raw, "://") {
		if u, err := url.Parse(raw); err == nil && u.Host == "" && strings.HasPrefix(u.Query().Get("host"), "/") {
			return raw // a Unix socket (postgres:///db?host=/run/postgresql): the test's own connection says
		}
		return need(t, "DISLOCK_TEST_PG", DefaultPG, "5432")
	}
	host, port := pgKeywordAddr(raw)
	if strings.HasPrefix(host, "/") {
		return raw // a Unix socket: the test's own connection says
	}
	dial(t, "DISLOCK_TEST_PG", net.JoinHostPort(host, port))
	return raw
}

// PGParam returns the PostgreSQL connection string raw (a URL or the
// keyword/value form) with the parameter key set to value, replacing the
// value raw gives it. value must need no quoting.
func PGParam(t testing.TB, raw, key, value string) string {
	t.Helper()
	if !strings.Contains(raw, "://") { // keyword/value form: the last setting wins
		return raw + " " + key + "=" + value
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal("the PostgreSQL URL cannot be parsed")
	}
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String()
}

// pgKeywordAddr returns the first host and port of a keyword/value
// PostgreSQL connection string, with libpq's defaults (PGHOST, PGPORT,
// localhost, 5432) for those it does not name. Values may be quoted with
// single quotes.
func pgKeywordAddr(raw string) (host, port string) {
	kv := map[string]string{}
	for rest := strings.TrimSpace(raw); rest != ""; rest = strings.TrimSpace(rest) {
		key, after, ok := strings.Cut(rest, "=")
		if !ok {
			break
		}
		key, after = strings.TrimSpace(key), strings.TrimLeft(after, " \t")
		var val string
		if strings.HasPrefix(after, "'") {
			var b strings.Builder
			i := 1
			for ; i < len(after) && after[i] != '\''; i++ {
				if after[i] == '\\' && i+1 < len(after) {
					i++
				}
				b.WriteByte(after[i])
			}
			val, rest = b.String(), after[min(i+1, len(after)):]
		} else if end := strings.IndexAny(after, " \t\n\r\v\f"); end >= 0 {
			val, rest = after[:end], after[end:]
		} else {
			val, rest = after, ""
		}
		kv[key] = val
	}
	host, port = kv["host"], kv["port"]
	if host == "" {
		host = os.Getenv("PGHOST")
	}
	if port == "" {
		port = os.Getenv("PGPORT")
	}
	host, _, _ = strings.Cut(host, ",")
	port, _, _ = strings.Cut(port, ",")
	if host == "" {
		host = "localhost"
	}
	if port == "" {
		port = "5432"
	}
	return host, port
}

// Redis returns the Redis URL for tests, failing (CI) or skipping the test
// when the server does not accept connections.
func Redis(t testing.TB) string {
	t.Helper()
	return need(t, "DISLOCK_TEST_REDIS", DefaultRedis, "6379")
}

// MySQL returns the MySQL / MariaDB URL or DSN for tests (DISLOCK_TEST_MYSQL,
// DefaultMySQL when unset), failing (CI) or skipping the test when the
// server does not accept connections. The test is skipped, also under CI,
// when the variable is set to the empty string: MySQL is then not tested.
func MySQL(t testing.TB) string {
	t.Helper()
	raw, set := os.LookupEnv("DISLOCK_TEST_MYSQL")
	if set && raw == "" {
		t.Skip("DISLOCK_TEST_MYSQL is set empty: MySQL is not tested")
	}
	if !set {
		raw = DefaultMySQL
	}
	var host string
	if u, err := url.Parse(raw); err == nil && (u.Scheme == "mysql" || u.Scheme == "mariadb") {
		host = u.Host
		if u.Port() == "" {
			host = net.JoinHostPort(u.Hostname(), "3306")
		}
	} else if _, rest, ok := strings.Cut(raw, "tcp("); ok && strings.Contains(rest, ")") {
		// A go-sql-driver DSN, user:password@tcp(host:port)/db (parsed
		// here without the driver, which the modules that use this
		// package need not require).
		host, _, _ = strings.Cut(rest, ")")
		if _, _, err := net.SplitHostPort(host); err != nil {
			host = net.JoinHostPort(host, "3306")
		}
	} else if strings.Contains(raw, "unix(") {
		return raw // a Unix socket: the test's own connection says
	} else {
		t.Fatal("DISLOCK_TEST_MYSQL is neither a mysql:// URL nor a go-sql-driver DSN")
	}
	dial(t, "DISLOCK_TEST_MYSQL", host)
	return raw
}

// CI reports whether the tests run under CI (CI=true).
func CI() bool {
	v := strings.ToLower(os.Getenv("CI"))
	return v == "true" || v == "1"
}

func need(t testing.TB, env, def, port string) string {
	t.Helper()
	raw := os.Getenv(env)
	if raw == "" {
		raw = def
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("%s is not a valid URL", env)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), port)
	}
	dial(t, env, host)
	return raw
}

func dial(t testing.TB, env, host string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", host, 3*time.Second)
	if err != nil {
		msg := fmt.Sprintf("%s: server at %s not reachable (%v); run scripts/test.sh, which starts it", env, host, err)
		if CI() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	conn.Close()
}

// Name returns a unique name for a test's keys or tables: prefix, then a
// random suffix of lowercase letters and digits.
func Name(prefix string) string {
	return prefix + strings.ToLower(rand.Text()[:10])
}

// ReadFile returns the contents of the file at path, failing t when it
// cannot be read.
func ReadFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
