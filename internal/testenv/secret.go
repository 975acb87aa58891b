package testenv

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

// Secret is the password the secret-keeping tests put in their targets.
const Secret = "s3cr3t-sentinel-pw"

// OpenKeepsSecret checks the rule that an Open never puts its target (a URL,
// DSN or connection string) or the password in it in an error: open must
// fail on each of targets, whose password is Secret, and none of its errors
// may contain Secret or "127.0.0.1:bad" (the host of a target that cannot
// be parsed, which a quoted target would show).
func OpenKeepsSecret[O any](t testing.TB, open func(ctx context.Context, target string, opts ...O) (*core.Client, error), targets ...string) {
	t.Helper()
	ctx := Context(t, 30*time.Second)
	for _, target := range targets {
		c, err := open(ctx, target)
		if err == nil {
			_ = c.Close()
			t.Fatalf("Open succeeded on a bad target")
		}
		if strings.Contains(err.Error(), Secret) || strings.Contains(err.Error(), "127.0.0.1:bad") {
			t.Errorf("error leaks the target: %v", err)
		}
	}
}

// OpenedLocker checks a Locker an Open returned, with client options that
// set the default owner to owner: its sessions carry that owner (the
// options reached core.New), and it closes without error. It closes l.
func OpenedLocker(t testing.TB, ctx context.Context, l core.Locker, owner string) {
	t.Helper()
	s, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if s.Owner() != owner {
		t.Errorf("owner %q: WithClientOptions not applied", s.Owner())
	}
	_ = s.Release(ctx)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}
