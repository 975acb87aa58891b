package pg

import (
	"context"
	"errors"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A key that is tried again and again while another process holds it
// costs the store one read per try (sqlbackend.BusyHints): a TryAcquire
// without a waiter of a key found held lately reads its row first (peek),
// a statement that takes no lock, writes nothing and sets nothing.

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
		b.hints.Note(req.Key, 0)
		return nil
	case err != nil:
		return core.Unclaimed(poolerHint(err)) // a read: nothing was claimed
	case !live || mine || semLimit(owner) > 0:
		b.hints.Note(req.Key, 0)
		return nil
	}
	busy := heldBy(req.Key, owner, token, acquired, expire, deref(left))
	b.hints.NoteBusy(req, busy)
	return busy
}

// heldBy is the busy answer for key held by a live lease.
func heldBy(key, owner string, token int64, acquired, expire pgtype.Timestamptz, left int64) error {
	return core.Busy(key, &core.Info{
		Key: key, Owner: owner, Token: uint64(token), AcquiredAt: acquired.Time,
		ExpiresAt: expire.Time, Remaining: time.Duration(left) * time.Microsecond,
	})
}
