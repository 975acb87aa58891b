package testenv

import (
	"net"
	"os"
	"strconv"
	"testing"
)

// Rule: the server a keyword/value DISLOCK_TEST_PG names is the one its
// host and port keywords say, whatever their order and quoting.
func TestPGKeywordAddr(t *testing.T) {
	t.Setenv("PGHOST", "")
	t.Setenv("PGPORT", "")
	for _, c := range []struct{ dsn, host, port string }{
		{"host=127.0.0.1 user=postgres dbname=test", "127.0.0.1", "5432"},
		{"user=postgres port=6432 dbname=test host=db.example", "db.example", "6432"},
		{"host = 10.0.0.5  port = 5433", "10.0.0.5", "5433"},
		{"dbname='my db' password='it is' host='/var/run/postgresql'", "/var/run/postgresql", "5432"},
		{`password='a\'b c' host=h2`, "h2", "5432"},
		{"host=a,b port=7,8", "a", "7"},
		{"dbname=test", "localhost", "5432"},
		{"host=h3\tport=9", "h3", "9"},
	} {
		if host, port := pgKeywordAddr(c.dsn); host != c.host || port != c.port {
			t.Errorf("pgKeywordAddr(%q) = %q, %q, want %q, %q", c.dsn, host, port, c.host, c.port)
		}
	}
	t.Setenv("PGHOST", "envhost")
	t.Setenv("PGPORT", "7777")
	if host, port := pgKeywordAddr("dbname=test"); host != "envhost" || port != "7777" {
		t.Errorf("pgKeywordAddr without host and port = %q, %q, want PGHOST and PGPORT", host, port)
	}
}

// Rule: PGParam sets a parameter in either form, over the value the string
// gives it.
func TestPGParam(t *testing.T) {
	for _, c := range []struct{ raw, want string }{
		{"postgres://u@h/db", "postgres://u@h/db?search_path=s"},
		{"postgres://u@h/db?search_path=app&sslmode=disable", "postgres://u@h/db?search_path=s&sslmode=disable"},
		{"host=h dbname=db search_path=app", "host=h dbname=db search_path=app search_path=s"},
	} {
		if got := PGParam(t, c.raw, "search_path", "s"); got != c.want {
			t.Errorf("PGParam(%q) = %q, want %q", c.raw, got, c.want)
		}
	}
}

// TestLoopbackPortsOutsideEphemeral: the ports for servers that tests stop
// and start again are distinct, free, and outside the kernel's range for
// the local ends of outgoing connections when it leaves room.
func TestLoopbackPortsOutsideEphemeral(t *testing.T) {
	ports, err := LoopbackPorts(20)
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := outsideEphemeral()
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] {
			t.Fatalf("port %d handed out twice: %v", p, ports)
		}
		seen[p] = true
		if hi-lo >= 1000 && (p < lo || p >= hi) {
			t.Errorf("port %d is outside [%d, %d), the ports no outgoing connection takes", p, lo, hi)
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("port %d: %v", p, err)
		}
		l.Close()
	}
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil && hi-lo < 1000 {
		t.Logf("the ephemeral range %q leaves no room: ports from the kernel", b)
	}
}
