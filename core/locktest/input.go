package locktest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

func testBadKeys(t *testing.T, e *env) {
	a := e.proc(t)
	for name, k := range map[string]string{
		"empty":   "",
		"toolong": e.prefix + strings.Repeat("k", core.MaxKeyLen),
		"badutf8": e.prefix + "\xff\xfe",
		"nul":     e.prefix + "a\x00b",
	} {
		_, err := a.l.TryAcquire(ctxT(t, 10*time.Second), k)
		if !errors.Is(err, core.ErrInvalidKey) || !strings.Contains(err.Error(), "key") {
			t.Errorf("rule %q: %s key: got %v", "bad keys are rejected with ErrInvalidKey naming the key", name, err)
		}
		_, err = a.l.Acquire(ctxT(t, 10*time.Second), k)
		if !errors.Is(err, core.ErrInvalidKey) {
			t.Errorf("Acquire with %s key: %v", name, err)
		}
	}
}

func testBadOptions(t *testing.T, e *env) {
	a := e.proc(t)
	k := e.key(t)
	for _, c := range []struct {
		name string
		opts []core.Option
	}{
		{"TTL", []core.Option{core.TTL(0)}},
		{"TTL", []core.Option{core.TTL(-time.Second)}},
		{"RenewInterval", []core.Option{core.TTL(time.Second), core.RenewDeadline(500 * time.Millisecond), core.RenewInterval(500 * time.Millisecond)}},
		{"RenewDeadline", []core.Option{core.TTL(time.Second), core.RenewDeadline(time.Second)}},
		{"Jitter", []core.Option{core.Jitter(-1)}},
		{"MinHold", []core.Option{core.MinHold(-1)}},
		{"ForSlot", []core.Option{core.ForSlot(nil)}},
		{"Owner", []core.Option{core.WithOwner("")}},
		{"Backoff", []core.Option{core.Backoff(0, time.Second)}},
	} {
		_, err := a.l.TryAcquire(ctxT(t, 10*time.Second), k, c.opts...)
		if !errors.Is(err, core.ErrInvalidOption) || !strings.Contains(err.Error(), c.name) {
			t.Errorf("rule %q: %s: got %v", "invalid options are rejected with ErrInvalidOption naming the option", c.name, err)
		}
	}
	// Nothing was written: the key is free.
	s := mustAcquire(t, a, k)
	s.Release(context.Background())
}

func testKeysRoundTrip(t *testing.T, e *env) {
	const rule = "any valid key works, up to MaxKeyLen bytes"
	a, b := e.proc(t), e.proc(t)
	keys := []string{
		e.prefix + "with space",
		e.prefix + "braces{x}y}{",
		e.prefix + "crlf\r\n*3\r\n$3\r\nDEL",
		e.prefix + "quote'\"; DROP TABLE x;--",
		e.prefix + "ünïcødé-鍵-🔒",
	}
	long := e.prefix + "long-"
	keys = append(keys, long+strings.Repeat("x", core.MaxKeyLen-len(long)))
	for _, k := range keys {
		s, err := a.l.TryAcquire(ctxT(t, 10*time.Second), k)
		if err != nil {
			t.Errorf("rule %q: %q: %v", rule, k, err)
			continue
		}
		if s.Key() != k {
			t.Errorf("Key() = %q, want %q", s.Key(), k)
		}
		mustBusy(t, rule, b, k)
		if !e.h.NoAdmin {
			if adm, ok := a.l.(core.Admin); ok {
				info, held, err := adm.Inspect(ctxT(t, 10*time.Second), k)
				if err != nil || !held || info.Key != k {
					t.Errorf("rule %q: Inspect(%q) = %+v %v %v", rule, k, info, held, err)
				}
			}
		}
		s.Release(context.Background())
	}
}
