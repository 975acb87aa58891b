// Package otel reports dislock's locks to OpenTelemetry: a core.Observer
// that emits spans for acquisitions, releases, renewals and lease losses,
// and metrics for their durations, the sessions held and the leases lost.
//
// Import it under another name, so it does not clash with
// go.opentelemetry.io/otel, and install it on a Locker:
//
//	import dlotel "github.com/dislock/dislock/otel"
//
//	obs, err := dlotel.New() // the global TracerProvider and MeterProvider
//	...
//	locker, err := pg.New(ctx, pool, pg.WithClientOptions(core.WithObserver(obs)))
//
// WithTracerProvider and WithMeterProvider choose other providers (nil is
// ignored); the global ones are read when New is called. The tracer and
// the meter use the instrumentation scope ScopeName (this package's import
// path) with version Version. One Observer may serve many Lockers.
//
// Observers compose (core.Observers, or core.WithObserver given several
// times): each Observer of this package keeps its state under context keys
// of its own, so two of them — say one per TracerProvider — each see every
// event, and their spans are siblings, children of the caller's span, not
// children of one another's.
//
// # Spans
//
// All spans are of kind internal. Work done for a caller is a child of the
// span in that caller's ctx; background work (renewals, losses) is the root
// of a trace of its own, linked to the acquisitions it concerns.
//
//	dislock.acquire     one per TryAcquire or Acquire on an open Locker with a
//	                    valid key and options, a child of the span in the
//	                    caller's ctx; it covers the whole acquisition, waiting
//	                    included. The backend's store calls run under it, so a
//	                    tracing driver's spans (otelpgx, redisotel) are its
//	                    children.
//	dislock.release     one per Release that sends (or, for slot locks, skips)
//	                    the release round trip: a child of the span in the ctx
//	                    passed to Release, linked to the session's
//	                    dislock.acquire span. When Close releases, there is no
//	                    caller: it is a new root with the same link. The
//	                    backend's release call runs under the ctx passed to
//	                    Release, so a driver's span for it is in the same trace,
//	                    a sibling of dislock.release. Releasing a session
//	                    already released does nothing and emits nothing; a
//	                    Release retried after a failed one gets another span.
//	dislock.renew       one per renewal call: a Locker renews all leases due
//	                    together in one round trip. It is the root of a new
//	                    trace, linked to the dislock.acquire span of every
//	                    session it renews (the link carries the session's key,
//	                    per WithKeyMode, and token), and the parent of a driver's
//	                    spans for the call. With WithRenewSpans(false) only
//	                    calls that fail get one (backdated to the call's start);
//	                    a driver's spans of the other calls then have no parent.
//	dislock.lease_lost  one per lost lease, emitted when the loss is detected:
//	                    the root of a new trace, linked to the session's
//	                    dislock.acquire span and, when there was one, to the
//	                    span of the last renewal call for it.
//
// A SpanProcessor's link limit (128 by default in the SDK) caps the links
// of a renewal call that renews more sessions; dislock.renew.sessions
// still counts them all.
//
// Span attributes:
//
//	dislock.backend       string  the backend: "postgresql", "mysql", "redis",
//	                              "etcd", "zookeeper", "memory" (see BackendName)
//	                                                                           (all)
//	dislock.mode          string  "try" (TryAcquire) or "wait" (Acquire)
//	                                                     (acquire, release, lost)
//	dislock.slot          bool    the lock is for a schedule slot (ForSlot)
//	                                                     (acquire, release, lost)
//	dislock.key           string  the lock key, with WithKeyMode(KeyRaw), the default
//	                                                     (acquire, release, lost)
//	dislock.key.sha256    string  hex SHA-256 of the key, with WithKeyMode(KeyHashed)
//	dislock.token         string  the fencing token, in decimal (acquire when
//	                              acquired, release, lease_lost); absent when 0
//	dislock.outcome       string  acquire: "acquired", "busy", "timeout", "error";
//	                              renew: "renewed", "lost" (a lease refused),
//	                              "error"; release: "released", "kept" (left to
//	                              expire: MinHold or slot), "error"
//	dislock.attempts      int     store attempts an acquisition made      (acquire)
//	dislock.wake          string  what woke a waiting Acquire for its last
//	                              attempt: "notification" (a release was
//	                              notified) or "poll" (the polling timer);
//	                              absent when the first attempt decided (acquire)
//	dislock.holder.owner  string  the holder named by the last busy answer,
//	                              when an attempt was busy and the store said
//	                                                                (acquire)
//	dislock.holder.token  string  its fencing token                  (acquire)
//	dislock.holder.remaining_seconds
//	                      float   the time its lease had left then, in
//	                              seconds                            (acquire)
//	dislock.held_seconds  float   time from acquisition to release or
//	                              loss, in seconds           (release, lease_lost)
//	dislock.lost.reason   string  "refused" (the store refused a renewal:
//	                              another owner holds the key, or it is gone;
//	                              core.ErrLeaseGone) or "deadline" (the renew
//	                              deadline, or a slot's end, passed) (lease_lost)
//	dislock.renew.sessions int    sessions a renewal call renews          (renew)
//	dislock.renew.lost    int     leases the store refused in the call    (renew)
//	error.type            string  core.ErrorType of the error, on failed spans:
//	                              "backend", "lease_lost", "closed",
//	                              "deadline_exceeded", ...
//
// WithAttributes adds static attributes to every span (and measurement).
//
// Busy is an outcome, not an error: a TryAcquire that finds the lock held
// (outcome "busy") and an Acquire whose ctx ends while it waits (outcome
// "timeout") leave the span status unset and set no error.type. A real
// failure (outcome "error", a failed or refused renewal call, a lease loss)
// sets error.type and the status Error with the sanitized message. No
// exception span events are added.
//
// # Metrics
//
//	dislock.acquire.duration  histogram  s          duration of acquisitions, waiting
//	                                                included; buckets 100µs to 1h.
//	                                                dislock.backend, dislock.mode,
//	                                                dislock.slot, dislock.outcome,
//	                                                error.type (outcome "error" only)
//	dislock.session.active    up-down    {session}  sessions held by this process.
//	                          counter               dislock.backend, dislock.mode,
//	                                                dislock.slot
//	dislock.session.duration  histogram  s          how long sessions were held,
//	                                                recorded once per session when it
//	                                                ends; buckets 10ms to 24h.
//	                                                dislock.backend, dislock.mode,
//	                                                dislock.slot, dislock.outcome
//	                                                ("released" for Release and
//	                                                Close, "lost")
//	dislock.renew.duration    histogram  s          duration of each renewal call
//	                                                (one or more sessions); buckets
//	                                                100µs to 30s. dislock.backend,
//	                                                dislock.outcome, error.type
//	                                                (failures only)
//	dislock.lease.lost        counter    {lease}    leases lost. dislock.backend,
//	                                                dislock.mode, dislock.slot,
//	                                                dislock.lost.reason
//
// The key is never a metric attribute, so the number of time series does
// not grow with the number of keys. WithAttributes adds static attributes
// to every measurement; WithMetricAttributesFn adds attributes computed
// from the key once per session, for a bounded grouping such as a job name
// (not to renewal calls, which serve many sessions). dislock's own
// attributes cannot be overridden by either.
//
// # Why background work starts its own traces
//
// With the default 30s TTL a session renews every 10s: 360 renewals an hour
// per held lock. In the trace of the request that acquired it, they would
// keep that trace from ever finishing, dominate it, and arrive after
// tail-sampling decisions were made (so they are usually dropped anyway).
// A renewal call is therefore its own trace, one per call rather than one
// per session, linked to the sessions it renews — the batch case span
// links exist for — and a lease loss is too, which a sampler sees as new
// and an error-based tail sampler keeps.
//
// # Secrets
//
// No DSN, password, owner token (the random value that guards renewals
// and releases) or payload becomes an attribute: only the backend's name,
// the key (per WithKeyMode), fencing tokens, the holder's owner name (its
// metadata, default host:pid), counts and durations do. Error messages are
// recorded in the status of failed spans, sanitized first: the userinfo of
// any URL ("postgres://user:pass@host" becomes "postgres://REDACTED@host")
// and the value of password-like parameters ("password=…", "token: …")
// are replaced by REDACTED, and with KeyHashed or KeyOmitted the key is
// replaced by "<key>". The sanitizer is a best-effort filter for what
// drivers put in their messages; error.type is the reliable, secret-free
// description. Metrics never carry messages.
//
// # Limits
//
// Renewals are reported per call through core.RenewBatchObserver, which
// core's engine calls; an Observer wrapped by something that hides that
// interface reports no renewals. The backend's release call runs under the
// ctx passed to Release, not under dislock.release, so a driver's release
// span is its sibling rather than its child.
//
// # Cost
//
// Without an observer a Locker pays nothing. With it, each acquisition,
// release and renewal call allocates a small context and its span; metric
// attribute sets are built once per backend, mode and slot, so this package
// builds no attribute set per measurement unless WithMetricAttributesFn is
// used or the measurement is of a failure.
package otel
