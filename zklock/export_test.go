package zklock

import "time"

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
