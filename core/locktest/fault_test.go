package locktest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

// Backends with every combination of the optional interfaces, to check
// that the fault wrapper forwards exactly the ones its backend has.

type bareBackend struct{}

func (bareBackend) Name() string { return "bare" }
func (bareBackend) TryAcquire(context.Context, core.AcquireRequest) (core.Lease, error) {
	return core.Lease{}, nil
}
func (bareBackend) Renew(context.Context, []core.RenewRequest) ([]error, error) { return nil, nil }
func (bareBackend) Release(context.Context, core.ReleaseRequest) error          { return nil }
func (bareBackend) Now(context.Context, string) (time.Time, error)              { return time.Time{}, nil }
func (bareBackend) Close() error                                                { return nil }

type watchOnly struct{}

func (watchOnly) Watch(context.Context, func(), func(string)) error { return nil }

type queueOnly struct{ watchOnly }

func (queueOnly) WatchTurns(context.Context, func(), func(string, string)) error { return nil }
func (queueOnly) Leave(context.Context, string, string) error                    { return nil }

// keeps is core.QueueKeeper's KeepsQueue.
type keeps bool

func (k keeps) KeepsQueue() bool { return bool(k) }

type semOnly struct{}

func (semOnly) Holders(context.Context, string) ([]core.Info, error) { return nil, nil }

type boundOnly struct{}

func (boundOnly) ClaimBound() time.Duration { return 7 * time.Second }

// The wrapper of a core.Queuer answers KeepsQueue as core.QueuerOf answers
// of the backend it wraps, so that the engine runs the queue's protocol on
// it exactly when it would on the bare backend.
func TestFaultForwardsKeepsQueue(t *testing.T) {
	for _, c := range []struct {
		name string
		b    core.Backend
		want bool
	}{
		{"Queuer", struct {
			bareBackend
			queueOnly
		}{}, true},
		{"QueueKeeper keeping a queue", struct {
			bareBackend
			queueOnly
			keeps
		}{keeps: true}, true},
		{"QueueKeeper keeping none", struct {
			bareBackend
			queueOnly
			keeps
		}{keeps: false}, false},
	} {
		w := newFault(c.b).backend()
		if _, ok := w.(core.Queuer); !ok {
			t.Errorf("%s: the wrapper hides core.Queuer", c.name)
		}
		if _, q := core.QueuerOf(w); q != c.want {
			t.Errorf("%s: the engine would run the wrapper as a core.Queuer: %v, want %v", c.name, q, c.want)
		}
	}
}

func TestFaultForwardsExactlyTheOptionalInterfaces(t *testing.T) {
	for _, c := range []struct {
		b                        core.Backend
		watch, queue, sem, bound bool
	}{
		{b: bareBackend{}},
		{b: struct {
			bareBackend
			watchOnly
		}{}, watch: true},
		{b: struct {
			bareBackend
			queueOnly
		}{}, watch: true, queue: true},
		{b: struct {
			bareBackend
			semOnly
		}{}, sem: true},
		{b: struct {
			bareBackend
			boundOnly
		}{}, bound: true},
		{b: struct {
			bareBackend
			watchOnly
			semOnly
		}{}, watch: true, sem: true},
		{b: struct {
			bareBackend
			watchOnly
			boundOnly
		}{}, watch: true, bound: true},
		{b: struct {
			bareBackend
			watchOnly
			semOnly
			boundOnly
		}{}, watch: true, sem: true, bound: true},
		{b: struct {
			bareBackend
			queueOnly
			semOnly
		}{}, watch: true, queue: true, sem: true},
		{b: struct {
			bareBackend
			queueOnly
			boundOnly
		}{}, watch: true, queue: true, bound: true},
		{b: struct {
			bareBackend
			queueOnly
			semOnly
			boundOnly
		}{}, watch: true, queue: true, sem: true, bound: true},
		{b: struct {
			bareBackend
			semOnly
			boundOnly
		}{}, sem: true, bound: true},
	} {
		name := fmt.Sprintf("watch=%v,queue=%v,sem=%v,bound=%v", c.watch, c.queue, c.sem, c.bound)
		w := newFault(c.b).backend()
		_, watch := w.(core.Watcher)
		_, queue := w.(core.Queuer)
		_, sem := w.(core.SemaphoreBackend)
		cb, bound := w.(core.ClaimBounder)
		if watch != c.watch || queue != c.queue || sem != c.sem || bound != c.bound {
			t.Errorf("%s: wrapper has watch=%v queue=%v sem=%v bound=%v", name, watch, queue, sem, bound)
		}
		if bound && cb.ClaimBound() != 7*time.Second {
			t.Errorf("%s: ClaimBound = %v, want the backend's 7s", name, cb.ClaimBound())
		}
		if _, ok := w.(core.Admin); !ok {
			t.Errorf("%s: the wrapper hides the Admin calls", name)
		}
		if w.Name() != "bare" {
			t.Errorf("%s: Name = %q", name, w.Name())
		}
	}
}
