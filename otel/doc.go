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
// # Spans
//
// All spans are of kind internal.
//
//	dislock.acquire     one per TryAcquire or Acquire on an open Locker with a
//	                    valid key and options,
//	                    a child of the span in the caller's ctx; it covers the
//	                    whole acquisition, waiting included.
//	dislock.release     one per Release that sends (or, for slot locks, skips)
//	                    the release round trip; a child of the session's
//	                    dislock.acquire span. Releasing a session already
//	                    released or lost does nothing and emits nothing; a
//	                    Release retried after a failed one gets another span.
//	dislock.renew       one per renewal of one session, a child of the
//	                    session's dislock.acquire span. Successful renewals
//	                    get a span only with WithRenewSpans(true); failed
//	                    ones always do (backdated to the renewal's start).
//	dislock.lease_lost  one per lost lease, emitted when the loss is detected.
//	                    It starts a new trace and links to the session's
//	                    dislock.acquire span.
//
// Span attributes:
//
//	dislock.backend       string  the backend's Name: "pg", "redis", "memory"  (all)
//	dislock.mode          string  "try" (TryAcquire), "wait" (Acquire) or
//	                              "slot" (ForSlot, either call)              (all)
//	dislock.key           string  the lock key, with WithKey(KeyRaw), the default  (all)
//	dislock.key.sha256    string  hex SHA-256 of the key, with WithKey(KeyHashed)  (all)
//	dislock.token         int     the fencing token (acquire when acquired,
//	                              release, renew, lease_lost); a string if
//	                              above math.MaxInt64; absent when 0
//	dislock.outcome       string  acquire: "acquired", "busy", "timeout", "error";
//	                              renew: "renewed", "lost", "error";
//	                              release: "released", "kept" (left to expire:
//	                              MinHold or slot), "error"
//	dislock.attempts      int     store attempts an acquisition made      (acquire)
//	dislock.wait_seconds  float   time the acquisition took, in seconds  (acquire)
//	dislock.held_seconds  float   time from acquisition to release or
//	                              loss, in seconds           (release, lease_lost)
//	error.type            string  core.ErrorType of the error, on failed spans:
//	                              "backend", "lease_lost", "closed",
//	                              "deadline_exceeded", ...
//
// Busy is an outcome, not an error: a TryAcquire that finds the lock held
// (outcome "busy") and an Acquire whose ctx ends while it waits (outcome
// "timeout") leave the span status unset. A failure (outcome "error", a
// refused or failed renewal, a lease loss) sets the status to Error with
// the message, sets error.type and adds an "exception" event with
// exception.type (the same value as error.type) and exception.message.
//
// # Metrics
//
//	dislock.acquire.duration  histogram  s          duration of acquisitions, waiting
//	                                                included; buckets 100µs to 30s.
//	                                                dislock.backend, dislock.mode,
//	                                                dislock.outcome, error.type
//	                                                (outcome "error" only)
//	dislock.sessions.active   up-down    {session}  sessions held by this process.
//	                          counter               dislock.backend, dislock.mode
//	dislock.held.duration     histogram  s          how long sessions were held,
//	                                                recorded once per session when it
//	                                                ends; buckets 10ms to 24h.
//	                                                dislock.backend, dislock.mode,
//	                                                dislock.outcome ("released" for
//	                                                Release and Close, "lost")
//	dislock.renew.duration    histogram  s          duration of each session's
//	                                                renewal; buckets 100µs to 30s.
//	                                                dislock.backend, dislock.mode,
//	                                                dislock.outcome, error.type
//	                                                (failures only)
//	dislock.leases.lost       counter    {lease}    leases lost.
//	                                                dislock.backend, dislock.mode
//
// The key is never a metric attribute, so the number of time series does
// not grow with the number of keys. WithMetricAttributesFn adds attributes
// computed from the key once per session, for a bounded grouping such as a
// job name; dislock's own attributes cannot be overridden by it.
//
// # Why renew spans are off by default
//
// With the default 30s TTL a session renews every 10s: 360 spans an hour
// per held lock, all in the trace of the request that acquired it. Such a
// trace never finishes while the job runs, is dominated by identical
// renewals, and grows after tail-sampling decisions have been made (so the
// late spans are usually dropped anyway). Renewals are therefore measured
// by dislock.renew.duration always, failed renewals get a span always,
// and successful ones get a span only with WithRenewSpans(true). For the
// same reason dislock.lease_lost starts its own trace, which a sampler
// sees as new and an error-based tail sampler keeps, and links to the
// acquisition instead of joining its (long finished) trace.
//
// # Secrets
//
// No DSN, password, owner token (the random value that guards renewals
// and releases) or payload becomes an attribute: only the backend's name,
// the key (per WithKey), the fencing token, counts and durations do.
// Error messages are recorded on failed spans, sanitized first: the
// userinfo of any URL ("postgres://user:pass@host" becomes
// "postgres://REDACTED@host") and the value of password-like parameters
// ("password=…", "token: …") are replaced by REDACTED, and with KeyHashed
// or KeyOmitted the key is replaced by "<key>". The sanitizer is a
// best-effort filter for what drivers put in their messages; error.type is
// the reliable, secret-free description. Metrics never carry messages.
//
// # Limits
//
// The release span is a child of the acquire span, not of the span in the
// ctx passed to Release, because the engine hands ReleaseStart the session's
// context. The backend's own spans (a database driver's tracer) are not
// children of dislock.acquire, because the engine calls the backend with
// the caller's ctx rather than the one AcquireStart returned.
//
// # Cost
//
// Without an observer a Locker pays nothing. With it, each acquisition,
// release and renewal allocates a small context and its span; metric
// attribute sets are built once per backend and mode, so this package
// builds no attribute set per measurement unless WithMetricAttributesFn is
// used. BENCHMARKS.md has the
// measured overhead of TryAcquire plus Release on memlock.
package otel
