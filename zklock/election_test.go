package zklock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/integrations/gocronlock"
	"github.com/dislock/dislock/zklock"
)

// Rule: an election whose lock TTL the ZooKeeper session cannot carry
// (core.DefaultTTL, 30s, on a session granted 30s, which allows 20s) fails
// at once, in core.CampaignContext and in gocronlock.NewElector, with the
// backend's ErrInvalidOption naming zklock's limit; before, Campaign
// returned nil and the campaign retried in silence, never electing.
func TestCampaignRejectsTTLBeyondTheSession(t *testing.T) {
	t.Parallel()
	l, err := zklock.New(ctxT(t, 30*time.Second), singleConnect(t), zklock.WithRoot(testRoot()))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, core.ErrInvalidOption) || !strings.Contains(err.Error(), "TTL") {
			t.Fatalf("%s = %v, want an ErrInvalidOption naming the TTL", what, err)
		}
	}
	start := time.Now()
	e, err := core.CampaignContext(context.Background(), l, "leader", core.WithLockOptions(core.TTL(core.DefaultTTL)),
		core.OnElected(func(core.Session) { t.Error("elected with a rejected TTL") }))
	if e != nil {
		e.Close()
	}
	check("CampaignContext", err)
	_, err = gocronlock.NewElector(l, "leader", gocronlock.TTL(core.DefaultTTL))
	check("NewElector", err)
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("rejected after %v, want at once", d)
	}
	// Within the session's limit the same election wins.
	el, err := gocronlock.NewElector(l, "leader")
	if err != nil {
		t.Fatal(err)
	}
	defer el.Close()
	if err := el.IsLeader(context.Background()); err != nil {
		t.Fatalf("IsLeader with the default TTL = %v", err)
	}
}
