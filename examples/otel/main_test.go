package main

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/dislock/dislock/examples/internal/extest"
)

func TestOtelExample(t *testing.T) {
	defer goleak.VerifyNone(t)
	extest.Contains(t, extest.Run(t, "", "", run),
		// spans: a renewed, a waited and a lost lock
		`"Name": "nightly-report"`, `"Name": "dislock.acquire"`, `"Name": "dislock.release"`,
		`"Name": "dislock.renew"`, `"Name": "dislock.lease_lost"`,
		`"Key": "dislock.wake"`, `"Key": "dislock.holder.owner"`, `"Key": "dislock.lost.reason"`,
		// metrics
		`"Name": "dislock.acquire.duration"`, `"Name": "dislock.session.active"`,
		`"Name": "dislock.session.duration"`, `"Name": "dislock.renew.duration"`, `"Name": "dislock.lease.lost"`,
	)
}
