package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dislock/dislock/examples/internal/exenv"
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

// otelOn runs the example with only env set (to url) of the backend
// variables and checks that it printed every span and metric it shows, and
// want.
func otelOn(t *testing.T, env, url string, want ...string) {
	for _, v := range exenv.Variables {
		t.Setenv(v, "")
	}
	if env != "" {
		t.Setenv(env, url)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range append([]string{
		// spans: a renewed, a waited and a lost lock
		`"Name": "nightly-report"`, `"Name": "dislock.acquire"`, `"Name": "dislock.release"`,
		`"Name": "dislock.renew"`, `"Name": "dislock.lease_lost"`,
		`"Key": "dislock.wake"`, `"Key": "dislock.holder.owner"`, `"Key": "dislock.lost.reason"`,
		// metrics
		`"Name": "dislock.acquire.duration"`, `"Name": "dislock.session.active"`,
		`"Name": "dislock.session.duration"`, `"Name": "dislock.renew.duration"`, `"Name": "dislock.lease.lost"`,
	}, want...) {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %s", want)
		}
	}
	if t.Failed() {
		t.Logf("output:\n%s", got)
	}
}
