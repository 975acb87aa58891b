package core_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
)

func TestTryDo(t *testing.T) {
	st := memlock.NewStore()
	a := newClient(t, st.Backend())
	bb := st.Backend()
	b := newClient(t, bb)
	ctx := context.Background()

	// Free: fn runs under the lock, which is released afterwards.
	var token uint64
	ran, err := core.TryDo(ctx, a, "job", func(ctx context.Context) error {
		s, ok := core.SessionFromContext(ctx)
		if !ok {
			t.Error("no session in fn's context")
		} else {
			token = s.Token()
		}
		if !st.Held("job") {
			t.Error("fn runs without the lock held")
		}
		return nil
	})
	if !ran || err != nil || token == 0 {
		t.Fatalf("free: ran %v err %v token %d", ran, err, token)
	}
	if st.Held("job") {
		t.Fatal("TryDo left the lock held")
	}

	// Held elsewhere: fn is skipped, without an error and without waiting.
	s := hold(t, a, "job")
	start := time.Now()
	ran, err = core.TryDo(ctx, b, "job", func(context.Context) error {
		t.Error("fn ran while the lock was held elsewhere")
		return nil
	})
	if ran || err != nil {
		t.Fatalf("busy: ran %v err %v, want false, nil", ran, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("busy TryDo waited %v", d)
	}
	s.Release(ctx)

	// fn's error is returned, with ran true.
	boom := errors.New("boom")
	ran, err = core.TryDo(ctx, b, "job", func(context.Context) error { return boom })
	if !ran || !errors.Is(err, boom) {
		t.Fatalf("fn error: ran %v err %v", ran, err)
	}

	// A store that fails is an error, not a skip.
	bb.SetDown(true)
	ran, err = core.TryDo(ctx, b, "job", func(context.Context) error {
		t.Error("fn ran on a store that is down")
		return nil
	})
	if ran || !errors.Is(err, memlock.ErrUnavailable) {
		t.Fatalf("store down: ran %v err %v, want false and ErrUnavailable", ran, err)
	}
	bb.SetDown(false)

	// Bad options are an error too.
	if ran, err := core.TryDo(ctx, b, "job", func(context.Context) error { return nil }, core.TTL(0)); ran || !errors.Is(err, core.ErrInvalidOption) {
		t.Fatalf("bad option: ran %v err %v", ran, err)
	}
}

// ForSlot(Every(d)) with d <= 0 fails when the options are resolved, with a
// message that names the option and says why.
func TestForSlotEveryNotPositive(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Minute} {
		err := core.ValidateOptions(core.ForSlot(core.Every(d)))
		if !errors.Is(err, core.ErrInvalidOption) || !strings.Contains(err.Error(), "ForSlot") || !strings.Contains(err.Error(), "period must be positive") {
			t.Errorf("ForSlot(Every(%v)): %v", d, err)
		}
	}
}

func TestBindAndDo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st, cs, _ := newPair(t, core.WithDefaults(core.TTL(30*time.Second)))
		s := hold(t, cs[0], "k")
		ctx, cancel := core.Bind(context.Background(), s)
		defer cancel()
		st.Steal("k")
		<-ctx.Done()
		if !errors.Is(context.Cause(ctx), core.ErrLeaseLost) {
			t.Fatalf("Bind cause %v", context.Cause(ctx))
		}
		if got, _ := core.SessionFromContext(ctx); got != s {
			t.Fatal("Bind lost the session")
		}
		// Do reports a loss even when fn returns nil.
		err := core.Do(context.Background(), cs[1], "d", func(ctx context.Context) error {
			st.Steal("d")
			<-ctx.Done()
			return nil
		})
		if !errors.Is(err, core.ErrLeaseLost) {
			t.Fatalf("Do = %v", err)
		}
	})
}

// TestDoReportsLossFoundAtRelease: a lease that the store dropped while fn
// ran, with no renewal in between to notice, is reported by Do's release:
// alone when fn succeeded, joined to fn's error when it failed.
func TestDoReportsLossFoundAtRelease(t *testing.T) {
	_, cs, _ := newPair(t, core.WithDefaults(core.TTL(time.Minute)))
	for _, want := range []error{nil, errors.New("work failed")} {
		err := core.Do(context.Background(), cs[0], "d", func(ctx context.Context) error {
			if _, err := cs[1].ForceRelease(ctx, "d"); err != nil {
				return err
			}
			s, err := cs[1].TryAcquire(ctx, "d")
			if err != nil {
				return err
			}
			defer s.Release(context.Background())
			return want
		})
		if !errors.Is(err, core.ErrLeaseLost) || !errors.Is(err, core.ErrLeaseGone) {
			t.Errorf("fn returned %v: Do = %v, want the loss", want, err)
		}
		if want != nil && !errors.Is(err, want) {
			t.Errorf("Do = %v, want fn's error %v too", err, want)
		}
	}
}
