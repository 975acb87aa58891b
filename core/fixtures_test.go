package core_test

import (
	"context"
	"fmt"
	"testing"

	"go.uber.org/goleak"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
	"github.com/dislock/dislock/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newPair returns two Lockers (processes) on one memlock store and their
// backend handles.
func newPair(t *testing.T, opts ...core.ClientOption) (*memlock.Store, [2]*core.Client, [2]*memlock.Backend) {
	t.Helper()
	st := memlock.NewStore()
	var cs [2]*core.Client
	var bs [2]*memlock.Backend
	for i := range cs {
		bs[i] = st.Backend()
		c, err := core.New(bs[i], opts...)
		if err != nil {
			t.Fatal(err)
		}
		cs[i] = c
		t.Cleanup(func() { c.Close() })
	}
	return st, cs, bs
}

// newClient returns a Locker on b, closed when the test ends.
func newClient(t *testing.T, b core.Backend, opts ...core.ClientOption) *core.Client {
	t.Helper()
	return testenv.Client(t, b, opts...)
}

// hold acquires key on l at once (TryAcquire), failing the test if it
// cannot.
func hold(t *testing.T, l core.Locker, key string, opts ...core.Option) core.Session {
	t.Helper()
	return testenv.Hold(t, context.Background(), l, key, opts...)
}

// holdN acquires the n keys prefix0 … prefix<n-1> on l at once.
func holdN(t *testing.T, l core.Locker, prefix string, n int, opts ...core.Option) []core.Session {
	t.Helper()
	ss := make([]core.Session, n)
	for i := range ss {
		ss[i] = hold(t, l, fmt.Sprint(prefix, i), opts...)
	}
	return ss
}

// campaign joins the election of key on l (CampaignContext), failing the
// test if it cannot; the Election is closed when the test ends.
func campaign(t *testing.T, ctx context.Context, l core.Locker, key string, opts ...core.ElectionOption) *core.Election {
	t.Helper()
	e, err := core.CampaignContext(ctx, l, key, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}
