package main

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/dislock/dislock/examples/internal/extest"
	"github.com/dislock/dislock/internal/testenv"
)

func TestOtelExample(t *testing.T) {
	defer goleak.VerifyNone(t)
	otelOn(t, "", "")
}

// TestOtelExampleMySQL runs the example with its first two locks on the
// MySQL / MariaDB of DISLOCK_TEST_MYSQL: their spans say "mysql".
func TestOtelExampleMySQL(t *testing.T) {
	otelOn(t, "MYSQL_URL", testenv.MySQL(t), `"Value": "mysql"`)
}

// otelOn runs the example with only variable set (to url) of the backend
// variables and checks that it printed every span and metric it shows, and
// want.
func otelOn(t *testing.T, variable, url string, want ...string) {
	extest.Contains(t, extest.Run(t, variable, url, run), append([]string{
		// spans: a renewed, a waited and a lost lock
		`"Name": "nightly-report"`, `"Name": "dislock.acquire"`, `"Name": "dislock.release"`,
		`"Name": "dislock.renew"`, `"Name": "dislock.lease_lost"`,
		`"Key": "dislock.wake"`, `"Key": "dislock.holder.owner"`, `"Key": "dislock.lost.reason"`,
		// metrics
		`"Name": "dislock.acquire.duration"`, `"Name": "dislock.session.active"`,
		`"Name": "dislock.session.duration"`, `"Name": "dislock.renew.duration"`, `"Name": "dislock.lease.lost"`,
	}, want...)...)
}
