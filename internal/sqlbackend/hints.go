package sqlbackend

import (
	"time"

	"github.com/dislock/dislock/core"
)

// BusyHints is, per key, the instant (local clock) until which a Backend
// last found the key held by another owner. A key that is tried again and
// again while another process holds it (a job that runs longer than its
// schedule's period, a queue's workers retrying a task) then costs the
// store one read per try: a TryAcquire without a waiter of such a key reads
// its row first, a statement that takes no lock and writes nothing. Only
// when that read finds the key free, or a semaphore's, is the claim sent: a
// round trip more, once per hold. A hint is only ever a reason to read
// first; every answer comes from the store (a Keys, at most MaxKeys keys).
// Its zero value is empty and ready.
type BusyHints struct{ until Keys[time.Time] }

// Held reports whether key was found held by another owner whose lease has
// not run out since.
func (h *BusyHints) Held(key string) bool {
	u, ok := h.until.Get(key)
	return ok && time.Now().Before(u)
}

// Note records what a claim or a read of key found: held by another owner
// for left more (left > 0), or not. A full set drops the hints that ran
// out first.
func (h *BusyHints) Note(key string, left time.Duration) {
	if left <= 0 {
		h.until.Delete(key)
		return
	}
	now := time.Now()
	h.until.Put(key, now.Add(left), func(u time.Time) bool { return !now.Before(u) })
}

// NoteBusy records a claim's answer err for req's key: held by another
// owner when err is busy with a live holder, else not.
func (h *BusyHints) NoteBusy(req core.AcquireRequest, err error) {
	var left time.Duration
	if nae, ok := err.(*core.NotAcquiredError); ok && nae.Holder != nil {
		left = nae.Holder.Remaining
	}
	h.Note(req.Key, left)
}
