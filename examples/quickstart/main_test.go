package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestQuickstart(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	t.Setenv("REDIS_URL", "")
	t.Setenv("ZK_URL", "")
	t.Setenv("ETCD_URL", "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"backend: memlock",
		"worker-a: acquired, fencing token 1",
		"worker-b: busy, held by worker-a",
		"worker-a: releasing",
		"worker-b: acquired after waiting, fencing token 2",
		"done",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
