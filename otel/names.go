package otel

import (
	"go.opentelemetry.io/otel/attribute"
)

// Span names.
const (
	SpanAcquire   = "dislock.acquire"
	SpanRenew     = "dislock.renew"
	SpanRelease   = "dislock.release"
	SpanLeaseLost = "dislock.lease_lost"
)

// Metric names.
const (
	MetricAcquireDuration = "dislock.acquire.duration"
	MetricSessionActive   = "dislock.session.active"
	MetricSessionDuration = "dislock.session.duration"
	MetricRenewDuration   = "dislock.renew.duration"
	MetricLeaseLost       = "dislock.lease.lost"
)

// Attribute keys.
const (
	AttrBackend         = attribute.Key("dislock.backend")
	AttrMode            = attribute.Key("dislock.mode")
	AttrSlot            = attribute.Key("dislock.slot")
	AttrOutcome         = attribute.Key("dislock.outcome")
	AttrKey             = attribute.Key("dislock.key")
	AttrKeySHA256       = attribute.Key("dislock.key.sha256")
	AttrToken           = attribute.Key("dislock.token")
	AttrAttempts        = attribute.Key("dislock.attempts")
	AttrWake            = attribute.Key("dislock.wake")
	AttrHolderOwner     = attribute.Key("dislock.holder.owner")
	AttrHolderToken     = attribute.Key("dislock.holder.token")
	AttrHolderRemaining = attribute.Key("dislock.holder.remaining_seconds")
	AttrHeldSeconds     = attribute.Key("dislock.held_seconds")
	AttrLostReason      = attribute.Key("dislock.lost.reason")
	AttrRenewSessions   = attribute.Key("dislock.renew.sessions")
	AttrRenewLost       = attribute.Key("dislock.renew.lost")
	AttrErrorType       = attribute.Key("error.type")
)

// Values of dislock.mode. A slot acquisition (ForSlot) has one of them
// too, and dislock.slot true.
const (
	ModeTry  = "try"  // TryAcquire
	ModeWait = "wait" // Acquire
)

// Values of dislock.outcome.
const (
	OutcomeAcquired = "acquired" // acquire
	OutcomeBusy     = "busy"     // acquire: held elsewhere (TryAcquire)
	OutcomeTimeout  = "timeout"  // acquire: ctx ended while waiting (Acquire)
	OutcomeError    = "error"    // acquire, renew, release: a failure
	OutcomeRenewed  = "renewed"  // renew
	OutcomeLost     = "lost"     // renew: a lease refused by the store; release: the store no longer had the lease; session.duration: lease lost
	OutcomeReleased = "released" // release: freed; session.duration: ended by Release or Close
	OutcomeKept     = "kept"     // release: left to expire (MinHold, slot)
)

// Values of dislock.wake: what woke a waiting Acquire for its last attempt.
const (
	WakeNotification = "notification" // a release notification
	WakePoll         = "poll"         // the polling timer
)

// Values of dislock.lost.reason.
const (
	LostRefused  = "refused"  // the store refused a renewal: another owner holds the key, or it is gone
	LostDeadline = "deadline" // the renew deadline (or the slot's end) passed without a renewal
)

// BackendName returns the dislock.backend value for a backend's Name: the
// OpenTelemetry db.system.name value where there is one ("pg" becomes
// "postgresql"), else the name itself ("mysql", "redis", "etcd",
// "zookeeper", "memory").
func BackendName(name string) string {
	switch name {
	case "pg", "postgres":
		return "postgresql"
	}
	return name
}
