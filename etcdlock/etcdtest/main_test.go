package etcdtest_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The embedded servers' peer connections (net/http, owned by etcd's
// rafthttp) may still be winding down when the last test ends; nothing in
// dislock uses net/http.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
		goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
	)
}
