// Package redislock is the Redis backend of dislock, on go-redis v9.
//
//	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
//	locker, err := redislock.New(rdb)
//	...
//	s, err := locker.TryAcquire(ctx, "nightly-report")
//	if errors.Is(err, core.ErrNotAcquired) {
//		return nil // another process runs it
//	}
//
// New accepts any redis.UniversalClient: a *redis.Client (one server, or a
// Sentinel failover client from redis.NewFailoverClient), a
// *redis.ClusterClient, or what redis.NewUniversalClient returns. The client
// stays the caller's; closing the Locker does not close it. Redis 6.2 or
// later (or Valkey) is required.
//
// # Connection failures
//
// A server that wants a password the client did not send fails every call
// with an error that says "authentication required" (the server's own
// reply to a script call, "ERR Protocol error: unauthenticated multibulk
// length", names nothing of the kind); a wrong password with the server's
// WRONGPASS. Neither ever reads as busy, and no message holds a password.
//
// A refused connection fails an acquisition after one attempt, naming the
// dial error, and costs no undo. go-redis alone would retry the claim
// MaxRetries times (default 3) after a failed dial and could not say then
// whether an earlier attempt had sent it, so the claim (and the clock read
// of ForSlot) goes out first as a single attempt: when it could not get a
// connection the claim surely never left, and the failure is returned at
// once; after any other failure go-redis's retries take over, as before.
// (This holds for *redis.Client, Sentinel's failover client included,
// *redis.ClusterClient and *redis.Ring; other UniversalClients keep their
// own retries.) That one attempt still dials up to DialerRetries times
// (default 5, 100 ms apart): about 0.4 s against a refused port. Set
// DialerRetries to 1 (the dislock CLI does; in a URL, dialer_retries=1)
// for a refusal in milliseconds. Other calls (renewals, releases, admin)
// keep the client's retry policy: one call fails after about 1.7 s with
// the defaults, and MaxRetries -1 makes it one attempt.
//
// # How locks are stored
//
// Lock key k is one string, "<prefix>:{k'}", with a PEXPIRE TTL:
//
//	held  "<flags>|<token>|<acquired_us>|<owner token>|<owner>"
//	free  "<flags>|<token>"
//
// The free form is a tombstone that a release writes over the lease, keeping
// its remaining TTL: it carries the last fencing token, so the next claim
// counts on from it. k' is k with "%" written as "%25" and "}" as "%7D", so
// the Cluster hash tag is always exactly k': every key of one lock shares a
// slot whatever bytes k holds, and k is recovered exactly from the Redis key
// (Admin.List). The prefix
// (WithPrefix, default "dislock") may contain no braces. A lock hash left
// by an earlier version of this package is refused with WRONGTYPE, never
// granted a second time: let those locks expire (or delete them) before
// upgrading.
//
// Every operation is one Lua script, kept as an embedded .lua file (the
// record format and the queue functions are a prelude shared by all; the
// common claim, release and losing try are fast.lua's and come before it,
// since defining its functions costs the server more than their own work)
// and run with EVALSHA, falling back to EVAL on NOSCRIPT (after a restart,
// a failover or SCRIPT FLUSH), inside pipelines too:
//
//   - acquire claims a free key with GET, TIME and SET (7 server commands
//     for an uncontended acquire + release, EVALSHA included), or answers
//     with the holder (owner, fencing token, acquired-at, remaining TTL).
//     A busy answer marks the record once, so that its release tells the
//     waiters; a claim of a key nobody waits for never writes more. Run again with the same owner
//     token it returns the same lease, so a retry after a lost reply is not
//     mistaken for "busy".
//   - renew extends, owner-checked, every lease of a batch: a Locker renews
//     all of its sessions in one round trip per node (one script call for
//     up to 256 leases on one server, one per hash slot on Cluster, in one
//     pipeline per node).
//   - release reads the record (GET) and writes the tombstone (SET) only
//     when the record is this lease's: another owner's record, a tombstone
//     or a value that is no lock record at all is left as it was, and the
//     release answers lease lost (core.ErrLeaseGone). It PUBLISHes on
//     "<prefix>:released" only when the record was marked by a waiter. For
//     a minimum hold it shortens the TTL instead.
//
// Slot locks (core.ForSlot) expire with PXAT at the slot's end, computed
// from the server's TIME.
//
// # How calls are sent
//
// A Backend's claims, releases and clock reads share round trips when they
// meet. A call made while none is on its way is sent at once; calls made
// while others are on their way queue, and up to three goroutines of the
// Backend send what has queued as one pipeline each. A busy client and
// server spend most of their time on the system calls of each request and
// reply, so 64 goroutines on distinct keys send about 13 calls per round
// trip, and the server's CPU per acquire + release falls below that of a
// lock that sends one command per round trip. On one server (not Cluster
// or Ring), the common claims and releases of a batch are one script call
// (batch.lua, which runs fast.lua's cases, with one TIME for all): a
// script call costs the server about as much as the work of a claim. A
// call that batch.lua leaves to the general path (a key someone holds or
// waits for, a lease that is gone) follows on its own script in the next
// round trip. A lone caller pays nothing:
// a release then goes out on its own goroutine, and a claim is handed to
// one of the senders, as it would be to the engine's call workers.
//
// On a *redis.Client (Sentinel failover included), *redis.ClusterClient or
// *redis.Ring, the Backend is a core.ContextBound: a claim or a clock read
// returns as soon as its ctx ends, cancelled or past its deadline, whatever
// the server does (go-redis itself cuts a call at its read timeout only). A
// call that was still queued then is never sent, and the engine owes it no
// undo; one that was sent goes on for the others of its batch, and the
// engine undoes it as after a lost reply: the release of its owner token
// waits for its answer, so that a claim held up on its way (on a connection
// still being set up, say) is not applied after the release that undoes it. Each batch is sent as a command
// is: its first attempt alone, without go-redis's retries, so that a call
// that got no connection is known not to have reached the server; after a
// failure that go-redis would retry, it is sent again with them. Other
// clients send each call on its own.
//
// # Waiters
//
// The Backend is a core.Queuer: the waiting Acquires of a key, from every
// process, wait in one first-in, first-out queue on the server, next to the
// lock ("<prefix>:{k'}:q", a sorted set of waiter ids, and
// "<prefix>:{k'}:qd", their deadlines; both vanish by PEXPIRE when
// abandoned). A free key goes to the first live waiter only, and never to
// a TryAcquire that did not wait while someone is queued; a waiter whose
// place expired (its process died) is dropped by whoever finds it first.
// A release, a ForceRelease or the Leave of the first waiter publishes a
// turn, "<key>\x00<waiter id>", so one waiter in one process wakes.
// Watch, for engines that do not queue, hears a turn as its key, and a
// busy answer without a waiter id asks for the plain message ("<key>").
// Nothing is published, and the queue is never read, for a key nobody
// waits for.
//
// When pub/sub is unavailable (a proxy that refuses SUBSCRIBE, say) the
// subscription fails within WithSubscribeTimeout and the Locker polls
// instead, retrying the subscription in the background.
//
// # Semaphores
//
// Backend is a core.SemaphoreBackend: core.Limit(n) with n > 1 claims one
// of n permits of a key, each with its own owner token, lease and fencing
// token.
//
//	s, err := locker.TryAcquire(ctx, "exports", core.Limit(4)) // at most 4 at once
//
// A semaphore lives at the lock's own Redis key, as a sorted set of owner
// tokens scored by their permit's expiry (Unix ms, server clock), next to
// the hash "<prefix>:{k'}:sem" (the limit, the last fencing token, and
// each permit's token, acquired-at and owner). Both expire with their last
// permit; when the last permit goes, the lock's tombstone takes the key's
// place with the last token. Acquire, release and the read of the holders
// are one script each, so one round trip; the renewals of a Locker's
// permits go in the same pipeline as its lock renewals (one script call
// for up to 256 permits of one server, or of one hash slot on Cluster), one
// round trip per interval however many permits it holds. A permit that is
// not renewed is free once its expiry is past: the next script that reads
// the key drops it. A full semaphore answers busy with the permit that
// expires first, so waiters poll no later than that. Fencing tokens
// strictly increase per key across permits and across lock use of the key
// (max(last + 1, server TIME in µs)).
//
// Waiters of a semaphore wait in the key's queue, like a lock's: a claim
// takes a free permit only when fewer live waiters are in line before it
// than there are free permits; a freed permit is the first live waiter's
// turn, and a grant that leaves a permit free tells the next one. With
// nobody in line a release publishes nothing, unless someone without a
// place in line was answered busy.
//
// A lock record is never a sorted set, so each kind sees the other: a
// semaphore claim on a held lock, a lock claim on a semaphore, and a
// semaphore claim with another limit fail with core.ErrLimitMismatch and
// claim nothing. The lock's scripts answer WRONGTYPE on a semaphore's key,
// and the Backend then runs the semaphore's, so Inspect returns the oldest
// permit, List one Info per permit, ForceRelease frees every permit (and
// tells the first waiter), and Leave passes the turn on. Holders
// (core.Client.Holders) lists every permit oldest first with Info.Limit
// set, or the one holder of a lock.
//
// # Guarantees
//
// On one Redis server that keeps its data:
//
//   - At most one owner token holds a key at any instant of the server's
//     clock; a session's local Deadline ends before the server's TTL (the
//     renew deadline is shorter than the TTL), so a holder that stops
//     renewing knows it lost the lock before anyone else can take it, given
//     clocks whose rates agree.
//   - Fencing tokens strictly increase per key: a new token is
//     max(last token + 1, server TIME in microseconds). The last token is in
//     the record (the lease, then its tombstone until the lease's TTL would
//     have run out); without it tokens keep growing as long as the server's
//     clock does not step back past earlier tokens.
//   - Renew and release check the owner token on the server: a stale session
//     never renews or frees a newer holder's lock.
//
// # What is not guaranteed
//
//   - Replication is asynchronous. After a failover (Sentinel, Cluster) the
//     promoted replica may not have the last acquisitions: two processes can
//     then hold one key at once, and fencing tokens are no longer ordered
//     unless the new master's clock is ahead of every earlier token (they
//     are microsecond timestamps, so the usual case is a larger token unless
//     clocks differ by more than the time since the last acquisition). WAIT
//     is not used; this is not Redlock. SENTINEL FAILOVER promotes the
//     replica while the old master still takes writes until it is demoted:
//     locks it grants meanwhile are lost, and their holders are told at
//     their next renewal (ErrLeaseGone). CLUSTER FAILOVER waits for the
//     replica to catch up and loses nothing.
//   - After a failover the client has to find the new master. A Sentinel
//     client (redis.NewFailoverClient) follows at once. A
//     *redis.ClusterClient learns of a replaced master only when it reloads
//     its slot map: on a MOVED reply, which a killed master never sends, or
//     when the map is older than ClusterOptions.ClusterStateReloadInterval
//     (60s by default). Until then renewals fail and holders lose their
//     locks at the renew deadline; set it to about a second.
//   - A restart without persistence loses every lock. Holders learn of it at
//     their next renewal (ErrLeaseLost); new tokens are still larger because
//     they come from the server's clock. With persistence (AOF), a restart
//     keeps what was written to disk, subject to its fsync policy.
//   - TTLs run on the server's wall clock. A clock that jumps forward
//     expires locks early; keep the server's clock slewed, not stepped.
//   - A slot's end is computed from the clock of the node that holds the
//     key (on Cluster, its slot's master), the same node that expires it.
//   - A lease is not a fence. Pass Session.Token to the resource you protect
//     and have it reject tokens smaller than the largest it has seen.
//
// # Unit tests without a server
//
// The scripts run on miniredis (github.com/alicebob/miniredis/v2), so code
// that takes locks can be tested without a Redis server. Call
// m.ClockTTL(true) so that TTLs run on the clock, as they do on a server
// (otherwise they only move with m.FastForward):
//
//	m := miniredis.RunT(t)
//	m.ClockTTL(true)
//	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
//	locker, err := redislock.New(rdb)
//
// For tests that need no Redis at all, core/memlock is the in-memory
// backend.
package redislock
