package core_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
	"github.com/dislock/dislock/internal/testenv"
)

// recorder is an Observer that writes down every hook call, and keeps the
// AcquireEnd events as they came.
type recorder struct {
	name   string
	mu     sync.Mutex
	events []string
	ends   []core.AcquireEndEvent
}

type obsKey struct{ name string }

func (r *recorder) add(ctx context.Context, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	tag, _ := ctx.Value(obsKey{r.name}).(string)
	r.events = append(r.events, fmt.Sprintf(format, args...)+" ctx="+tag)
}

func (r *recorder) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

func (r *recorder) AcquireStart(ctx context.Context, e core.AcquireStartEvent) context.Context {
	r.add(ctx, "acquire-start %s %s", e.Key, e.Mode)
	return context.WithValue(ctx, obsKey{r.name}, r.name)
}
func (r *recorder) AcquireEnd(ctx context.Context, e core.AcquireEndEvent) {
	r.add(ctx, "acquire-end %s ok=%v busy=%v attempts=%d", e.Key, e.Err == nil, errors.Is(e.Err, core.ErrNotAcquired), e.Attempts)
	r.mu.Lock()
	r.ends = append(r.ends, e)
	r.mu.Unlock()
}

// lastEnd is the latest AcquireEnd event.
func (r *recorder) lastEnd() core.AcquireEndEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ends[len(r.ends)-1]
}
func (r *recorder) RenewStart(ctx context.Context, e core.RenewStartEvent) context.Context {
	r.add(ctx, "renew-start %s", e.Key)
	return ctx
}
func (r *recorder) RenewEnd(ctx context.Context, e core.RenewEndEvent) {
	r.add(ctx, "renew-end %s ok=%v", e.Key, e.Err == nil)
}
func (r *recorder) ReleaseStart(ctx context.Context, e core.ReleaseStartEvent) context.Context {
	r.add(ctx, "release-start %s", e.Key)
	return ctx
}
func (r *recorder) ReleaseEnd(ctx context.Context, e core.ReleaseEndEvent) {
	r.add(ctx, "release-end %s kept=%v", e.Key, e.Kept)
}
func (r *recorder) Lost(ctx context.Context, e core.LostEvent) {
	r.add(ctx, "lost %s %v", e.Key, errors.Is(e.Err, core.ErrLeaseLost))
}

func TestObserverSeesEverything(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memlock.NewStore()
		r1, r2 := &recorder{name: "r1"}, &recorder{name: "r2"}
		c := newClient(t, st.Backend(), core.WithDefaults(core.TTL(30*time.Second)), core.WithObserver(r1), core.WithObserver(r2), core.WithObserver(nil))
		ctx := context.Background()
		s := hold(t, c, "a")
		if _, err := c.TryAcquire(ctx, "a"); !errors.Is(err, core.ErrNotAcquired) {
			t.Fatal(err)
		}
		time.Sleep(11 * time.Second) // one background renewal
		s.Release(ctx)
		s2, _ := c.TryAcquire(ctx, "b")
		st.Steal("b")
		<-s2.Done()
		want := []string{
			"acquire-start a try ctx=", "acquire-end a ok=true busy=false attempts=1 ctx=r1",
			"acquire-start a try ctx=", "acquire-end a ok=false busy=true attempts=1 ctx=r1",
			"renew-start a ctx=r1", "renew-end a ok=true ctx=r1",
			"release-start a ctx=r1", "release-end a kept=false ctx=r1",
			"acquire-start b try ctx=", "acquire-end b ok=true busy=false attempts=1 ctx=r1",
			"renew-start b ctx=r1", "renew-end b ok=false ctx=r1",
			"lost b true ctx=r1",
		}
		got := r1.list()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("events:\n got %q\nwant %q", got, want)
		}
		// Each observer finds its own values in the composed context.
		if g := r2.list(); len(g) != len(want) || g[1] != "acquire-end a ok=true busy=false attempts=1 ctx=r2" {
			t.Fatalf("second observer: %q", g)
		}
	})
}

// A backend without Admin makes the Client's Admin calls say so.
type bareBackend struct{ core.Backend }

func TestAdminUnsupported(t *testing.T) {
	c := newClient(t, bareBackend{memlock.NewStore().Backend()})
	ctx := context.Background()
	if _, _, err := c.Inspect(ctx, "k"); !errors.Is(err, core.ErrUnsupported) {
		t.Fatalf("Inspect: %v", err)
	}
	if _, err := c.List(ctx, ""); !errors.Is(err, core.ErrUnsupported) {
		t.Fatalf("List: %v", err)
	}
	if _, err := c.ForceRelease(ctx, "k"); !errors.Is(err, core.ErrUnsupported) {
		t.Fatalf("ForceRelease: %v", err)
	}
	// Without a Watcher, waiting still works by polling.
	s, _ := c.TryAcquire(ctx, "k", core.TTL(time.Second))
	testenv.AcquireReleased(t, ctx, c, s, 50*time.Millisecond, 5*time.Second).Release(ctx)
	if _, err := core.New(nil); !errors.Is(err, core.ErrInvalidOption) {
		t.Fatalf("New(nil): %v", err)
	}
}

// batchRecorder is a recorder that also sees whole renewal calls.
type batchRecorder struct {
	recorder
}

func (r *batchRecorder) RenewBatchStart(ctx context.Context, e core.RenewBatchStartEvent) context.Context {
	keys := ""
	for i, s := range e.Renewals {
		tag, _ := e.Contexts[i].Value(obsKey{r.name}).(string)
		keys += " " + s.Key + "@" + tag
	}
	r.add(ctx, "batch-start%s", keys)
	return context.WithValue(ctx, obsKey{r.name}, r.name+"-batch")
}

func (r *batchRecorder) RenewBatchEnd(ctx context.Context, e core.RenewBatchEndEvent) {
	ok := 0
	for _, s := range e.Renewals {
		if s.Err == nil {
			ok++
		}
	}
	r.add(ctx, "batch-end %d/%d err=%v", ok, len(e.Renewals), e.Err != nil)
}

// ctxBackend records the value of obsKey{name} in the ctx of each Renew.
type ctxBackend struct {
	core.Backend
	name string
	mu   sync.Mutex
	seen []string
}

func (b *ctxBackend) Renew(ctx context.Context, reqs []core.RenewRequest) ([]error, error) {
	tag, _ := ctx.Value(obsKey{b.name}).(string)
	b.mu.Lock()
	b.seen = append(b.seen, tag)
	b.mu.Unlock()
	return b.Backend.Renew(ctx, reqs)
}

func TestRenewBatchObserver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memlock.NewStore()
		b := &ctxBackend{Backend: st.Backend(), name: "b1"}
		r1, plain, r2 := &batchRecorder{recorder{name: "b1"}}, &recorder{name: "p"}, &batchRecorder{recorder{name: "b2"}}
		c := newClient(t, b, core.WithDefaults(core.TTL(30*time.Second)), core.WithObserver(r1), core.WithObserver(plain), core.WithObserver(r2))
		ctx := context.Background()
		for _, k := range []string{"a", "b"} {
			if _, err := c.TryAcquire(ctx, k); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(11 * time.Second) // one background renewal of both
		var batch []string
		for _, e := range r1.list() {
			if len(e) > 5 && e[:5] == "batch" {
				batch = append(batch, e)
			}
		}
		// The two keys are renewed in one call in either order; each
		// observer finds its session state in the sessions' contexts
		// and its own value in the call's context.
		if len(batch) != 2 || (batch[0] != "batch-start a@b1 b@b1 ctx=" && batch[0] != "batch-start b@b1 a@b1 ctx=") ||
			batch[1] != "batch-end 2/2 err=false ctx=b1-batch" {
			t.Fatalf("batch events: %q", batch)
		}
		if got := r2.list(); len(got) < 2 || got[len(got)-1] != "batch-end 2/2 err=false ctx=b2-batch" {
			t.Fatalf("second batch observer: %q", got)
		}
		b.mu.Lock()
		seen := fmt.Sprint(b.seen)
		b.mu.Unlock()
		if seen != "[b1-batch]" {
			t.Fatalf("the store call ran under %s, want the batch observers' context", seen)
		}
	})
}

func TestAcquireEndHolderAndWake(t *testing.T) {
	for _, c := range []struct {
		name  string
		watch bool
		want  core.Wake
	}{{"notify", true, core.WakeNotify}, {"poll", false, core.WakePoll}} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := memlock.NewStore()
				var b core.Backend = st.Backend()
				if !c.watch {
					b = bareBackend{b}
				}
				rec := &recorder{name: "waiter"}
				holder := newClient(t, b)
				waiter := newClient(t, b, core.WithObserver(rec))
				ctx := context.Background()
				h := hold(t, holder, "k", core.WithOwner("holder-1"))
				if _, err := waiter.TryAcquire(ctx, "k"); !errors.Is(err, core.ErrNotAcquired) {
					t.Fatal(err)
				}
				if e := rec.lastEnd(); e.Holder == nil || e.Holder.Owner != "holder-1" || e.Holder.Token != h.Token() || e.Wake != "" {
					t.Fatalf("busy try: holder %+v wake %q", e.Holder, e.Wake)
				}
				go func() { time.Sleep(time.Second); h.Release(ctx) }()
				s, err := waiter.Acquire(ctx, "k", core.Backoff(300*time.Millisecond, 300*time.Millisecond))
				if err != nil {
					t.Fatal(err)
				}
				defer s.Release(ctx)
				if e := rec.lastEnd(); e.Holder == nil || e.Holder.Owner != "holder-1" || e.Wake != c.want || e.Attempts < 2 {
					t.Fatalf("wait: holder %+v wake %q attempts %d, want wake %q", e.Holder, e.Wake, e.Attempts, c.want)
				}
			})
		})
	}
}
