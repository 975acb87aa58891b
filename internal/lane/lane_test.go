package lane

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// store is a fake store whose calls wait until let is closed (or, with
// let nil, answer at once), and which records the batches it got.
type store struct {
	mu      sync.Mutex
	let     chan struct{}
	batches [][]int // the values of each round trip's calls
}

func (s *store) wait() {
	s.mu.Lock()
	let := s.let
	s.mu.Unlock()
	if let != nil {
		<-let
	}
}

func (s *store) lane() *Lane[int] {
	return New(func(_ context.Context, v *int) {
		s.mu.Lock()
		s.batches = append(s.batches, []int{*v})
		s.mu.Unlock()
		s.wait()
		*v = -*v
	}, func(_ context.Context, calls []*Call[int]) {
		var vs []int
		for _, c := range calls {
			vs = append(vs, c.V)
		}
		s.mu.Lock()
		s.batches = append(s.batches, vs)
		s.mu.Unlock()
		s.wait()
		for _, c := range calls {
			c.V = -c.V
		}
	})
}

// do sends v through l and returns its outcome.
func do(ctx context.Context, l *Lane[int], v int, token string, direct bool) (int, error) {
	c := l.Get()
	c.V = v
	if err := l.Do(ctx, c, token, direct); err != nil {
		if errors.Is(err, ErrUnsent) {
			l.Put(c)
		}
		return 0, err
	}
	out := c.V
	l.Put(c)
	return out, nil
}

// TestCallsMetShareARoundTrip: a call made while the lane is idle goes at
// once; with MaxSenders batches on their way, the calls made meanwhile
// queue and go as one batch, each with its own outcome.
func TestCallsMetShareARoundTrip(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &store{let: make(chan struct{})}
		l := s.lane()
		defer l.Close()
		ctx := t.Context()
		var wg sync.WaitGroup
		got := make([]int, 9)
		call := func(i int, direct bool) {
			wg.Go(func() {
				out, err := do(ctx, l, i, "", direct)
				if err != nil {
					t.Errorf("call %d: %v", i, err)
				}
				got[i] = out
			})
			synctest.Wait()
		}
		call(1, true) // direct: the lane was idle
		call(2, true) // a sender's batch of one
		call(3, false)
		for i := 4; i < 9; i++ { // three on their way: these queue
			call(i, true)
		}
		close(s.let)
		wg.Wait()
		want := [][]int{{1}, {2}, {3}, {4, 5, 6, 7, 8}}
		if !slices.EqualFunc(s.batches, want, slices.Equal) {
			t.Fatalf("round trips %v, want %v", s.batches, want)
		}
		for i := 1; i < 9; i++ {
			if got[i] != -i {
				t.Fatalf("call %d got %d, want %d", i, got[i], -i)
			}
		}
	})
}

// TestCallerLeaves: a caller whose ctx ends while its call is queued takes
// it out, and it is never sent; one whose call is in a batch on its way
// returns at once, and a release of its owner token waits (After) until
// that batch is answered.
func TestCallerLeaves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &store{let: make(chan struct{})}
		l := s.lane()
		defer l.Close()
		var wg sync.WaitGroup
		for i := 1; i <= 2; i++ { // a direct call and a batch of one on their way
			wg.Go(func() { _, _ = do(t.Context(), l, i, "", true) })
			synctest.Wait()
		}
		taken, cancelTaken := context.WithCancel(t.Context())
		res := make(chan error, 2)
		go func() { _, err := do(taken, l, 3, "claim-3", true); res <- err }()
		synctest.Wait() // the third sender has it
		queued, cancelQueued := context.WithCancel(t.Context())
		go func() { _, err := do(queued, l, 4, "claim-4", true); res <- err }()
		synctest.Wait()
		cancelQueued()
		if err := <-res; !errors.Is(err, ErrUnsent) || !errors.Is(err, context.Canceled) {
			t.Fatalf("queued call whose caller left: %v, want ErrUnsent and context.Canceled", err)
		}
		cancelTaken()
		if err := <-res; errors.Is(err, ErrUnsent) || !errors.Is(err, context.Canceled) {
			t.Fatalf("call on its way whose caller left: %v, want context.Canceled, not ErrUnsent", err)
		}
		if err := l.After(t.Context(), "claim-4"); err != nil {
			t.Fatalf("After a claim never sent: %v", err)
		}
		after := make(chan error, 1)
		go func() { after <- l.After(t.Context(), "claim-3") }()
		synctest.Wait()
		select {
		case err := <-after:
			t.Fatalf("After returned (%v) while the claim it follows is on its way", err)
		default:
		}
		short, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if err := l.After(short, "claim-3"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("After with a ctx that ends first: %v", err)
		}
		close(s.let)
		if err := <-after; err != nil {
			t.Fatalf("After, once the claim was answered: %v", err)
		}
		wg.Wait()
		for _, b := range s.batches {
			if slices.Contains(b, 4) {
				t.Fatalf("the call whose caller left it queued was sent: %v", s.batches)
			}
		}
	})
}
