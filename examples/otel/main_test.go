package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestOtelExample(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	t.Setenv("REDIS_URL", "")
	t.Setenv("ETCD_URL", "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"Name": "nightly-report"`, `"Name": "dislock.acquire"`, `"Name": "dislock.release"`, `"Name": "dislock.lease_lost"`, `"dislock.outcome"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %s", want)
		}
	}
}
