package otel_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
	"github.com/dislock/dislock/internal/testenv"
	dlotel "github.com/dislock/dislock/otel"
)

// named is a memlock backend under another Name whose fencing tokens start
// at base.
type named struct {
	*memlock.Backend
	name string
	base uint64
}

func (b *named) Name() string { return b.name }

func (b *named) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	l, err := b.Backend.TryAcquire(ctx, req)
	l.Token += b.base
	return l, err
}

func TestBackendNames(t *testing.T) {
	for name, want := range map[string]string{"pg": "postgresql", "mysql": "mysql", "redis": "redis", "memory": "memory",
		"etcd": "etcd", "zookeeper": "zookeeper", "custom": "custom"} {
		if got := dlotel.BackendName(name); got != want {
			t.Errorf("BackendName(%q) = %q, want %q", name, got, want)
		}
	}
	f := newFixture(t)
	l := f.lockerOn(t, &named{Backend: f.store.Backend(), name: "pg"})
	s := testenv.Hold(t, context.Background(), l, "k")
	s.Release(context.Background())
	for _, sp := range f.sr.Ended() {
		wantAttrs(t, sp, map[attribute.Key]any{dlotel.AttrBackend: "postgresql"})
	}
	if n := tally(f.collect(t), dlotel.MetricAcquireDuration, map[attribute.Key]string{dlotel.AttrBackend: "postgresql"}); n != 1 {
		t.Errorf("acquire.duration{postgresql} count %d, want 1", n)
	}
}

// dislock.token is a string whatever the token's size.
func TestTokenIsAlwaysAString(t *testing.T) {
	f := newFixture(t)
	small := f.locker(t)
	big := f.lockerOn(t, &named{Backend: f.store.Backend(), name: "memory", base: 1 << 63})
	ctx := context.Background()
	for _, l := range []*core.Client{small, big} {
		s := testenv.Hold(t, ctx, l, "k")
		s.Release(ctx)
	}
	want := []string{"1", "9223372036854775810"}
	for i, sp := range f.spans(dlotel.SpanAcquire) {
		v := attrs(sp)[dlotel.AttrToken]
		if v.Type() != attribute.STRING || v.AsString() != want[i] {
			t.Errorf("acquire %d: dislock.token %v (%v), want the string %s", i, v.Emit(), v.Type(), want[i])
		}
	}
	for _, sp := range f.spans(dlotel.SpanRelease) {
		if v := attrs(sp)[dlotel.AttrToken]; v.Type() != attribute.STRING {
			t.Errorf("release: dislock.token is a %v", v.Type())
		}
	}
}

func TestWithAttributes(t *testing.T) {
	f := newFixture(t,
		dlotel.WithAttributes(attribute.String("deployment.environment.name", "staging")),
		dlotel.WithAttributes(attribute.String("tenant", "acme"), dlotel.AttrBackend.String("spoofed")))
	l := f.locker(t)
	ctx := context.Background()
	s := testenv.Hold(t, ctx, l, "k")
	if _, err := l.TryAcquire(ctx, "k"); err == nil {
		t.Fatal("second TryAcquire acquired")
	}
	s.Release(ctx)
	for _, sp := range f.sr.Ended() {
		got := attrs(sp)
		if got["deployment.environment.name"].AsString() != "staging" || got["tenant"].AsString() != "acme" {
			t.Errorf("%s lacks the static attributes: %v", sp.Name(), sp.Attributes())
		}
		// The SDK keeps the last value of a repeated key: dislock's own.
		if got[dlotel.AttrBackend].AsString() != "memory" {
			t.Errorf("%s: dislock.backend = %q", sp.Name(), got[dlotel.AttrBackend].AsString())
		}
	}
	rm := f.collect(t)
	match := map[attribute.Key]string{"deployment.environment.name": "staging", "tenant": "acme", dlotel.AttrBackend: "memory"}
	if n := tally(rm, dlotel.MetricAcquireDuration, match); n != 2 {
		t.Errorf("acquire.duration with the static attributes: count %d, want 2", n)
	}
	if n := tally(rm, dlotel.MetricSessionDuration, match); n != 1 {
		t.Errorf("session.duration with the static attributes: count %d, want 1", n)
	}
	if _, err := dlotel.New(dlotel.WithAttributes(attribute.KeyValue{})); err == nil {
		t.Error("New accepted an invalid attribute")
	}
}
