package mysqllock

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-sql-driver/mysql"

	"github.com/dislock/dislock/core"
	shared "github.com/dislock/dislock/internal/lane"
)

// The plain statements of a free key (freeClaimSQL, freeReleaseSQL) go
// through a lane (internal/lane): statements that meet share a round trip.
// A statement made while none of the Backend's is on its way is sent at
// once, on its caller's goroutine, as it was without the lane. Statements
// made while others are on their way queue, and a sender sends what has
// queued as one CALL of the batch procedure: one round trip, one
// transaction and one commit for the batch, where a busy server spends
// most of its time on each statement's network round, its thread's wake-up
// and its commit.
//
// The batch procedure runs the same two statements, item by item in key
// order (so that two batches never wait for each other's rows in a
// cycle), and answers for each what the statement alone would have: the
// rows it changed and, for a claim, its token. A batch the server refuses
// whole (a deadlock, a lock wait timeout, the claim bound passed) changed
// nothing: each of its statements then took nothing, and its caller goes
// on to the procedure that decides in every case (acquire, release), as
// after a statement alone that changed no row.
//
// A claim's bound is kept as a statement alone keeps it: each claim of the
// batch is made only while the batch has waited for row locks no longer
// than the claim timeout's half since the CALL started on the server, and
// the batch commits only then; the batch is sent under the earliest
// deadline of its claims, so that the CALL starts on the server before any
// of them has passed. A claim whose caller has already left is answered
// "nothing claimed" without being sent.

// laneCall is one plain statement in the lane, and its outcome.
type laneCall struct {
	release bool   // freeReleaseSQL, else freeClaimSQL
	key     string // the lock's key
	owner   string // a claim's owner
	holder  string // the owner token
	ttl     int64  // a claim's TTL (µs)
	half    int64  // a claim's bound on the server (µs)

	rows  int64 // rows the statement changed
	token int64 // a claim's token (LAST_INSERT_ID)
	err   error
}

// queued is a statement in a batch.
type queued = shared.Call[laneCall]

func (b *Backend) newLane() *shared.Lane[laneCall] {
	return shared.New(b.sendOne, b.sendBatch)
}

// exec sends v through the lane and returns its outcome. A statement whose
// text cannot go in the batch's JSON (not valid UTF-8) is sent on its own.
// err is ctx's when the caller left the statement: wrapped with
// shared.ErrUnsent when it was never sent, else it is on its way and a
// release of a claim's owner token waits for it (afterClaims).
func (b *Backend) exec(ctx context.Context, v laneCall) (rows, token int64, err error) {
	if !utf8.ValidString(v.key) || !utf8.ValidString(v.owner) || !utf8.ValidString(v.holder) {
		b.sendOne(ctx, &v)
		return v.rows, v.token, v.err
	}
	q := b.lane.Get()
	q.V = v
	var claim string
	if !v.release {
		claim = v.holder
	}
	if err := b.lane.Do(ctx, q, claim, true); err != nil {
		if errors.Is(err, shared.ErrUnsent) {
			b.lane.Put(q)
		}
		return 0, 0, err
	}
	rows, token, err = q.V.rows, q.V.token, q.V.err
	b.lane.Put(q)
	return rows, token, err
}

// afterClaims waits until no claim of owner token whose caller left it is
// on its way in the lane, or until ctx ends.
func (b *Backend) afterClaims(ctx context.Context, token string) error {
	if err := b.lane.After(ctx, token); err != nil {
		return fmt.Errorf("mysqllock: %w", err)
	}
	return nil
}

// sendOne sends v's statement on its own.
func (b *Backend) sendOne(ctx context.Context, v *laneCall) {
	var res sql.Result
	if v.release {
		res, v.err = b.releaseFree.ExecContext(ctx, []byte(v.key), []byte(v.holder))
	} else {
		res, v.err = b.claimFree.ExecContext(ctx, []byte(v.owner), []byte(v.holder), v.ttl, []byte(v.key), v.half)
	}
	if v.err != nil {
		return
	}
	v.rows, _ = res.RowsAffected()
	if !v.release {
		v.token, _ = res.LastInsertId()
	}
}

// batchItem is one statement in the batch procedure's JSON argument: r is
// 1 for a release; o, t a claim's owner and TTL (µs).
type batchItem struct {
	R int    `json:"r"`
	K string `json:"k"`
	O string `json:"o"`
	H string `json:"h"`
	T int64  `json:"t,omitempty"`
}

// sendBatch sends calls as one CALL of the batch procedure (see the top
// of this file).
func (b *Backend) sendBatch(ctx context.Context, calls []*queued) {
	sent := make([]*queued, 0, len(calls))
	var first time.Time // the earliest deadline of the claims
	var half int64
	for _, q := range calls {
		if !q.V.release {
			if err := q.Ctx().Err(); err != nil {
				q.V.err = core.Unclaimed(err) // its caller left: not sent
				continue
			}
			if d, ok := q.Ctx().Deadline(); ok && (first.IsZero() || d.Before(first)) {
				first = d
			}
			half = max(half, q.V.half)
		}
		sent = append(sent, q)
	}
	if len(sent) == 0 {
		return
	}
	if !first.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, first)
		defer cancel()
	}
	slices.SortStableFunc(sent, func(x, y *queued) int { return cmp.Compare(x.V.key, y.V.key) })
	items := make([]batchItem, len(sent))
	for i, q := range sent {
		it := batchItem{K: q.V.key, H: q.V.holder}
		if q.V.release {
			it.R = 1
		} else {
			it.O, it.T = q.V.owner, q.V.ttl
		}
		items[i] = it
	}
	arg, err := json.Marshal(items)
	if err != nil {
		for _, q := range sent {
			q.V.err = fmt.Errorf("mysqllock: batch: %w", err)
		}
		return
	}
	var out string
	b.batches.Add(1)
	err = b.batch.QueryRowContext(ctx, arg, half).Scan(&out)
	var refused *mysql.MySQLError
	switch {
	case errors.As(err, &refused):
		// Rolled back whole: nothing changed (rows 0 for each).
		return
	case err != nil:
		for _, q := range sent {
			q.V.err = err
		}
		return
	}
	if err := readBatch(out, sent); err != nil {
		for _, q := range sent {
			q.V.err = err
		}
	}
}

// readBatch reads the batch procedure's answer into sent: for each item,
// in order, "<rows>:<token>,"; an empty answer when the batch passed its
// claims' bound and was rolled back (nothing changed: rows 0 for each).
func readBatch(out string, sent []*queued) error {
	if out == "" {
		return nil
	}
	for i, q := range sent {
		item, rest, ok := strings.Cut(out, ",")
		rows, token, ok2 := strings.Cut(item, ":")
		if !ok || !ok2 {
			return fmt.Errorf("mysqllock: batch: answer for %d statements ends at %d", len(sent), i)
		}
		n, err1 := strconv.ParseInt(rows, 10, 64)
		t, err2 := strconv.ParseInt(token, 10, 64)
		if err := errors.Join(err1, err2); err != nil {
			return fmt.Errorf("mysqllock: batch: answer: %w", err)
		}
		q.V.rows, q.V.token = n, t
		out = rest
	}
	return nil
}
