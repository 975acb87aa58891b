package zklock

import (
	"context"
	"time"

	"github.com/dislock/dislock/core"
)

// ClaimData is the data of a claim node, for tests that write one by hand.
func ClaimData(ttl time.Duration, owner string) []byte { return claimData(ttl, owner) }

// EncodeName and DecodeName expose the key encoding.
var (
	EncodeName = encodeName
	DecodeName = decodeName
)

// SetWatchHook makes fn run when a watch of one of b's waiting places
// fires, before the event is acted on; the function fn returns runs once it
// has been. Set it before b's first acquire.
func SetWatchHook(b *Backend, fn func(path string) func()) { b.watchHook = fn }

// SetEvaluateHook makes fn run when one of b's places is judged, before
// the judgement's store calls. Set it before b's first acquire.
func SetEvaluateHook(b *Backend, fn func()) { b.evaluateHook = fn }

// EvaluatePlace judges waiter's place on key again from a fresh read of the
// key's children, as a watch that fires or an attempt does.
func EvaluatePlace(b *Backend, key, waiter string) {
	b.mu.Lock()
	pl := b.places[placeKey(key, waiter)]
	b.mu.Unlock()
	if pl != nil {
		b.evaluate(pl, nil)
	}
}

// SetExpireHook makes fn run before the deletion of an expired place's
// node; the function fn returns runs once the deletion is done.
func SetExpireHook(b *Backend, fn func() func()) { b.expireHook = fn }

// UncertainPlace records a place for req's wait whose node is uncertain,
// as a first attempt whose create went unanswered leaves it; it expires
// after req.WaiterTTL.
func UncertainPlace(b *Backend, req core.AcquireRequest) {
	b.newPlace(placeKey(req.Key, req.Waiter), req, &place{}, time.Now())
}

// ArmOwn arms on the node at path the watch a waiting place keeps on its
// own node, and reports whether it was armed (the node exists).
func ArmOwn(ctx context.Context, b *Backend, path string) bool {
	return b.armOwn(ctx, &place{path: path})
}

// SetArmHook makes fn run before one of b's places arms a watch on path (a
// data watch when data, else a child watch; the watch on its own node is a
// data watch); the function fn returns runs once the store answered and
// the watch is recorded. Set it before b's first acquire.
func SetArmHook(b *Backend, fn func(path string, data bool) func()) { b.armHook = fn }
