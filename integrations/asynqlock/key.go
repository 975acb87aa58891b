package asynqlock

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"unicode/utf8"

	"github.com/hibiken/asynq"
)

// KeyFunc derives the lock key of a task (the middleware puts its prefix
// before it). An empty key means the task runs without a lock. An error is
// permanent: the middleware returns it wrapped with asynq.SkipRetry, so the
// task is archived.
type KeyFunc func(ctx context.Context, t *asynq.Task) (string, error)

// maxPart is the longest task-derived string used verbatim in a key; longer
// ones (and ones that are not valid UTF-8 or contain NUL) are replaced by
// their hash, so that keys stay within core.MaxKeyLen.
const maxPart = 512

// ByType keys a task by its type name: one task of each type runs at a time.
func ByType(_ context.Context, t *asynq.Task) (string, error) {
	return bound(t.Type()), nil
}

// ByTypeAndPayload keys a task by its type name and a hash of its payload
// (128 bits of SHA-256, hex): tasks with equal payloads exclude each other,
// different payloads run in parallel. The key is at most about 560 bytes
// whatever the payload's size.
func ByTypeAndPayload(_ context.Context, t *asynq.Task) (string, error) {
	sum := sha256.Sum256(t.Payload())
	return bound(t.Type()) + ":" + hex.EncodeToString(sum[:16]), nil
}

// ByTaskID keys a task by its ID, which stays the same across retries: the
// same task never runs twice at once (asynq can start a task again while a
// previous run still works on it, for example after the worker's lease on
// it expired). It fails outside an asynq server, where the context carries
// no task ID.
func ByTaskID(ctx context.Context, _ *asynq.Task) (string, error) {
	id, ok := asynq.GetTaskID(ctx)
	if !ok || id == "" {
		return "", errors.New("no task ID in context")
	}
	return "id:" + bound(id), nil
}

// ByHeader keys a task by the value of its header name (set with
// asynq.NewTaskWithHeaders). A task without that header, or with an empty
// value, runs without a lock.
func ByHeader(name string) KeyFunc {
	return func(_ context.Context, t *asynq.Task) (string, error) {
		v := t.Headers()[name]
		if v == "" {
			return "", nil
		}
		return bound(v), nil
	}
}

// bound returns s, or its hash when s is long or not a valid key part.
func bound(s string) string {
	if len(s) <= maxPart && utf8.ValidString(s) && !strings.ContainsRune(s, 0) {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:16])
}
