package pg

import (
	"context"
	"errors"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/sqlbackend"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A key that is tried again and again while another process holds it (a
// job that runs longer than its schedule's period, a queue's workers
// retrying a task) costs the store one read per try: a Backend remembers,
// per key, until when it last found the key held by another owner, and a
// TryAcquire without a waiter of such a key reads its row first (peek), a
// statement that takes no lock, writes nothing and sets nothing. Only when
// that read finds the key free, or a semaphore's, is the claim sent: a
// round trip more, once per hold. A hint is only ever a reason to read
// first; every answer comes from the store (sqlbackend.Keys, at most
// 4,096 keys).

// busyHints is the per-key instant (local clock) until which a Backend last
// found the key held by another owner.
type busyHints struct{ until sqlbackend.Keys[time.Time] }

// held reports whether key was found held by another owner whose lease has
// not run out since.
func (h *busyHints) held(key string) bool {
	u, ok := h.until.Get(key)
	return ok && time.Now().Before(u)
}

// note records what a claim or a read of key found: held by another owner
// for left more (left > 0), or not. A full set drops the hints that ran
// out first.
func (h *busyHints) note(key string, left time.Duration) {
	if left <= 0 {
		h.until.Delete(key)
		return
	}
	now := time.Now()
	h.until.Put(key, now.Add(left), func(u time.Time) bool { return !now.Before(u) })
}

// noteBusy records a claim's answer err for req's key: held by another owner
// when err is busy with a live holder, else not.
func (h *busyHints) noteBusy(req core.AcquireRequest, err error) {
	var left time.Duration
	if nae, ok := err.(*core.NotAcquiredError); ok && nae.Holder != nil {
		left = nae.Holder.Remaining
	}
	h.note(req.Key, left)
}

// peek reads req's key on conn (a TryAcquire without a waiter of a key
// found held lately). It returns the busy answer when a live lease of
// another owner holds the key, nil when the claim must be sent (the key is
// free, a semaphore's, or the read found this owner token's own lease), or
// the read's failure.
func (b *Backend) peek(ctx context.Context, conn *pgxpool.Conn, req core.AcquireRequest) error {
	var (
		live, mine       bool
		owner            string
		token            int64
		left             *int64
		acquired, expire pgtype.Timestamptz
	)
	err := conn.QueryRow(ctx, b.stmt.peek, req.Key, req.OwnerToken).Scan(&live, &mine, &owner, &token, &acquired, &expire, &left)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		b.hints.note(req.Key, 0)
		return nil
	case err != nil:
		return poolerHint(err)
	case !live || mine || semLimit(owner) > 0:
		b.hints.note(req.Key, 0)
		return nil
	}
	busy := heldBy(req.Key, owner, token, acquired, expire, deref(left))
	b.hints.noteBusy(req, busy)
	return busy
}

// heldBy is the busy answer for key held by a live lease.
func heldBy(key, owner string, token int64, acquired, expire pgtype.Timestamptz, left int64) error {
	return core.Busy(key, &core.Info{
		Key: key, Owner: owner, Token: uint64(token), AcquiredAt: acquired.Time,
		ExpiresAt: expire.Time, Remaining: time.Duration(left) * time.Microsecond,
	})
}
