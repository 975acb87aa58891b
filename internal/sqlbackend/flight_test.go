package sqlbackend

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

// Rule: a try that waits for a claim on its way answers busy with the
// winner's lease when that claim won; when it did not, or when the try's
// own ctx ends first, it gets no busy answer.
func TestClaimsAnswers(t *testing.T) {
	var c Claims
	cl, lead := c.Begin("k")
	if !lead {
		t.Fatal("the first Begin of a key does not lead")
	}
	if again, lead := c.Begin("k"); lead || again != cl {
		t.Fatal("a Begin while a claim of the key is on its way does not follow it")
	}
	if other, lead := c.Begin("other"); !lead || other == cl {
		t.Fatal("a claim of another key follows the first one")
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if err := cl.Wait(ended, "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with an ended ctx = %v, want its error", err)
	}
	exp := time.Now().Add(time.Minute)
	c.End("k", cl, "winner", true, core.Lease{Token: 7, ExpiresAt: exp})
	var busy *core.NotAcquiredError
	if err := cl.Wait(context.Background(), "k"); !errors.As(err, &busy) || busy.Holder == nil ||
		busy.Holder.Owner != "winner" || busy.Holder.Token != 7 || busy.Holder.Remaining <= 0 {
		t.Fatalf("Wait for a claim that won = %v, want busy, held by winner with token 7", err)
	}
	if _, lead := c.Begin("k"); !lead {
		t.Fatal("a Begin after End follows the ended claim")
	}
	lost, _ := c.Begin("lost")
	c.End("lost", lost, "loser", false, core.Lease{})
	if err := lost.Wait(context.Background(), "lost"); err != nil {
		t.Fatalf("Wait for a claim that did not win = %v, want nil (ask the store)", err)
	}
}

// Rule: a claim led with Lead ends, and wakes the tries waiting for it,
// even when the claim panics; the waiting tries then ask the store.
func TestClaimsLeadEndsOnPanic(t *testing.T) {
	var c Claims
	cl, _ := c.Begin("k")
	func() {
		defer func() { _ = recover() }()
		_, _ = c.Lead("k", cl, "o", func() (core.Lease, error) { panic("claim") })
	}()
	if err := cl.Wait(context.Background(), "k"); err != nil {
		t.Fatalf("Wait for a claim that panicked = %v, want nil (ask the store)", err)
	}
	if _, lead := c.Begin("k"); !lead {
		t.Fatal("a Begin after a claim that panicked follows it")
	}
}
