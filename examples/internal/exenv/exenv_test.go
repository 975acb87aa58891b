package exenv

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/internal/testenv"
)

// With several server variables set, the backend's description says which
// one was used and which were not.
func TestChosenNamesTheOthers(t *testing.T) {
	for _, v := range Variables {
		t.Setenv(v, "")
	}
	if got := Chosen("Redis", "REDIS_URL"); got != "Redis (REDIS_URL)" {
		t.Errorf("alone: %q", got)
	}
	t.Setenv("REDIS_URL", "redis://127.0.0.1:1/0")
	t.Setenv("ZK_URL", "zk://127.0.0.1:1")
	t.Setenv("DATABASE_URL", testenv.PG(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lockers, backend, closeAll, err := Lockers(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll()
	if len(lockers) != 1 || !strings.HasPrefix(backend, "PostgreSQL (DATABASE_URL)") || !strings.Contains(backend, "REDIS_URL, ZK_URL also set, not used") {
		t.Errorf("backend %q", backend)
	}
}
