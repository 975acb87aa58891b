package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestOtelExample(t *testing.T) {
	defer goleak.VerifyNone(t)
	t.Setenv("DATABASE_URL", "")
	t.Setenv("REDIS_URL", "")
	t.Setenv("ETCD_URL", "")
	t.Setenv("ZK_URL", "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		// spans: a renewed, a waited and a lost lock
		`"Name": "nightly-report"`, `"Name": "dislock.acquire"`, `"Name": "dislock.release"`,
		`"Name": "dislock.renew"`, `"Name": "dislock.lease_lost"`,
		`"Key": "dislock.wake"`, `"Key": "dislock.holder.owner"`, `"Key": "dislock.lost.reason"`,
		// metrics
		`"Name": "dislock.acquire.duration"`, `"Name": "dislock.session.active"`,
		`"Name": "dislock.session.duration"`, `"Name": "dislock.renew.duration"`, `"Name": "dislock.lease.lost"`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %s", want)
		}
	}
	if t.Failed() {
		t.Logf("output:\n%s", got)
	}
}
