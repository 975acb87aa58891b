// Package prune schedules the deletions of ended rows that the SQL backends
// (pg, mysqllock) run after their releases: one after the first release,
// then at most one per interval, and at once again after one that filled
// its batch.
package prune

import (
	"sync"
	"time"
)

// Schedule says when a prune is due. The zero value is due at once. It is
// safe for concurrent use.
type Schedule struct {
	mu   sync.Mutex
	next time.Time
}

// Due reports whether a prune is due now; when it is, the next one is due
// every later.
func (s *Schedule) Due(every time.Duration) bool {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Before(s.next) {
		return false
	}
	s.next = now.Add(every)
	return true
}

// Again makes the next prune due at once (the last one filled its batch).
func (s *Schedule) Again() {
	s.mu.Lock()
	s.next = time.Time{}
	s.mu.Unlock()
}

// Run calls prune when a prune is due (Due), and makes the next one due at
// once (Again) when prune reports a full batch of deleted rows. prune's
// error is dropped: the release it follows succeeded, and the next prune
// retries.
func (s *Schedule) Run(every time.Duration, batch int64, prune func() (int64, error)) {
	if !s.Due(every) {
		return
	}
	if n, err := prune(); err == nil && n >= batch {
		s.Again()
	}
}
