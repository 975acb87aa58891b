package benchtest

import (
	"testing"

	"github.com/dislock/dislock/core"
)

// TryAcquireRelease times one TryAcquire and Release of key on l per
// iteration, reporting allocations: the engine's cost per acquisition on a
// store without I/O, with whatever options l was built with.
func TryAcquireRelease(b *testing.B, l core.Locker, key string) {
	b.Helper()
	op := AcquireRelease(l, key)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := op(); err != nil {
			b.Fatal(err)
		}
	}
}
