package main

import (
	"testing"

	"github.com/dislock/dislock/etcdlock/etcdtest"
)

// TestQuickstartEtcd runs the quick start on etcd: DISLOCK_TEST_ETCD when
// set, otherwise a private embedded server.
func TestQuickstartEtcd(t *testing.T) {
	u := etcdtest.Shared(t)
	if u == "" {
		u = etcdtest.Start(t, 1).URL()
	}
	quickstartOn(t, "ETCD_URL", u, "etcd")
}
