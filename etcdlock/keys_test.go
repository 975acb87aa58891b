package etcdlock

import "testing"

// TestClaimKeys checks that the keys a claim's transaction names, sliced
// from one array, are those of etcdKey, permitRange and queueRange, and
// that none can grow into another.
func TestClaimKeys(t *testing.T) {
	b := &Backend{prefix: "dislock/"}
	for _, key := range []string{"k", "jobs/nightly-report"} {
		ks := b.claimKeys(key)
		lo, hi := b.permitRange(key)
		qlo, qhi := b.queueRange(key)
		for _, c := range []struct {
			name      string
			got, want string
			cap       int
		}{
			{"k", string(ks.k), b.etcdKey(key), cap(ks.k)},
			{"lo", string(ks.lo), lo, cap(ks.lo)},
			{"hi", string(ks.hi), hi, cap(ks.hi)},
			{"qlo", string(ks.qlo), qlo, cap(ks.qlo)},
			{"qhi", string(ks.qhi), qhi, cap(ks.qhi)},
		} {
			if c.got != c.want || c.cap != len(c.want) {
				t.Errorf("%q: %s = %q (cap %d), want %q", key, c.name, c.got, c.cap, c.want)
			}
		}
	}
}
