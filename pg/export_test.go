package pg

// NoteReleased makes b take key for one whose lease it lately released, so
// that its next claim of key without a waiter is claimFree's UPDATE.
func NoteReleased(b *Backend, key string) { b.released.Note(key) }

// ClaimWaiters returns how many tries of key wait for the claim of key
// that b has on its way.
func ClaimWaiters(b *Backend, key string) int { return b.claims.Waiting(key) }
