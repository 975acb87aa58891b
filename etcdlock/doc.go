// Package etcdlock is the etcd backend of dislock, on the official client
// (go.etcd.io/etcd/client/v3).
//
//	cli, err := clientv3.New(clientv3.Config{
//		Endpoints:   []string{"127.0.0.1:2379"},
//		DialOptions: etcdlock.StaticWindows(),
//	})
//	...
//	locker, err := etcdlock.New(cli)
//	...
//	s, err := locker.TryAcquire(ctx, "nightly-report")
//	if errors.Is(err, core.ErrNotAcquired) {
//		return nil // another process runs it
//	}
//
// The client stays the caller's: closing the Locker does not close it.
// ParseURL reads etcd://host:port[,host:port] and etcds:// URLs into a
// client configuration. Its configurations have StaticWindows, fixed gRPC
// flow-control windows, which a configuration of your own should have too:
// with gRPC's default window estimate a client sends the server a ping for
// nearly every watch event it receives, and every Locker waiting on a key
// receives each of its hand-offs. The package is its own Go module, so that programs
// using only the other dislock backends do not get gRPC in their module
// graph. It works with etcd 3.4 or later servers; 3.7 or later is
// recommended (see below). Its tests run an embedded etcd v3.7.3, on one
// member and on a three-member cluster, and the conformance suite also
// passes against Debian's etcd 3.4.23 (DISLOCK_TEST_ETCD).
//
// etcd's own concurrency package (Session, Mutex) is not used: its
// Session.Done fires at or after the server's lease expiry, not before, and
// a retried Mutex.Unlock deletes the key by name, which can delete a newer
// holder's lock. The lease engine of dislock's core does the waiting,
// renewing and loss detection; this package only talks to etcd.
//
// # How locks are stored
//
// Lock k is the etcd key <prefix>k (WithPrefix, default "dislock/"), whose
// value is a small JSON record: owner, owner token, acquired-at (the
// acquirer's clock) and, for slot locks, the slot's end. The key is bound to
// a lease, with an ID the backend picks at random: the sessions of one
// Backend with the same TTL (in whole seconds) share one lease, so that
// renewing them is one keepalive; a slot lock has a lease of its own.
// The loss of a shared lease (it expired, or was revoked) is the loss of
// every session on it; the deletion of one key (a release, a
// ForceRelease) ends only that key's session. A key on a shared lease
// whose session no renewal has asked for in longer than the lease's TTL
// (it ended without a release that reached the store) is deleted,
// owner-checked, by the next renewal: the store keeps it no longer than a
// lease of its own would have.
//
//   - Acquire is one transaction: if the key's create_revision is 0 (no
//     such key), put it bound to the session's lease; otherwise read it.
//     etcd can bind a key only to a lease that already exists, and a
//     transaction cannot grant one, so the lease comes first: the claim
//     takes the shared lease of its TTL. The engine lets a claim be kept
//     up to its Slack (half a renew interval: 5 s of the default 30 s TTL)
//     less than its TTL if the lease says so (core.Lease): while the shared
//     lease's last refresh leaves the claim its TTL less that, the claim is
//     the transaction alone, and its Lease.ExpiresAt is the shared lease's
//     refresh plus its TTL, from which the engine counts the session's
//     deadline and first renewal. Only when the refresh is older is a
//     keepalive sent together with the transaction, in the same round trip:
//     a steady run of claims sends one keepalive per Slack, not one per
//     claim, and an uncontended acquire + release is 2 requests. Without a
//     shared lease yet, the claim is a lease grant and then the
//     transaction: two round trips. A Backend grants one shared lease of a
//     TTL at a time: claims that find none while a grant is in flight wait
//     for it (or for their ctx, failing with core.Unclaimed: they sent
//     nothing) and take the lease it made, so that concurrent first claims
//     share one lease. A claim whose keepalive fails while its
//     transaction succeeded is undone, since the lease might then expire
//     before the session's deadline.
//   - A busy answer costs one more round trip, reading the holder's
//     remaining lease time. A key last seen busy is claimed with reads
//     first: etcd proposes a transaction that contains a put through Raft
//     even when its compare fails, a read-only one it does not.
//   - The fencing token is the key's mod_revision: the revision of the
//     claim that created it, or of the release that granted it to a waiter
//     by putting it over the old holder's (below). Every new holder gets
//     the key at a new, larger store revision, so tokens strictly increase
//     per key; renewals keep it. A permit's token is its key's
//     create_revision (a permit is never put again while held).
//   - Renewal of all of a Locker's sessions is one round trip per renew
//     interval: a keepalive message per shared lease on the Backend's stream,
//     sent together with transactions of up to 128 reads each
//     (WithMaxTxnOps; 1,000 leases are 8 transactions, sent at once) that
//     check each key is still bound to its session's lease with its token
//     — a live lease does not prove the key is still ours (an operator may
//     have deleted it). A lease whose keepalive reports TTL 0, a missing key
//     and a key bound elsewhere are each a loss (core.ErrLeaseLost); a failed
//     request leaves the outcome unknown and the engine retries until the
//     session's deadline. One attempt waits at most a sixth of the shortest
//     TTL in it (at least 100 ms), and a keepalive left unanswered that long
//     ends the stream: a member that hangs without closing the connection
//     costs one attempt, and the retry goes to another member.
//   - Release is one transaction that deletes the key if it is still bound
//     to the session's lease at the session's token (mod_revision); the
//     shared lease stays. When the Backend's watch knows the key's first
//     waiter, the release grants the key to it instead (see Turns below). A release that finds the key gone or another's
//     changes nothing and answers lost (core.ErrLeaseGone; the engine takes
//     it as done on a retry), and the comparison on both lease and revision
//     means it can never delete a newer holder's key.
//   - An acquire whose outcome is unknown (its reply was lost) retires its
//     lease: no new claim takes it, and it is revoked once no session of
//     the Backend is bound to it (at once when there is none): that
//     deletes the key if the claim was applied, and makes the claim fail
//     if it is still on its way. Until then the undo deletes the key by
//     its owner token. The lease ID is known before anything is sent, so
//     even a grant whose reply was lost is revoked.
//   - A release before a minimum hold ends (core.MinHold) grants a lease of
//     the remaining hold, moves the key to it with an owner-checked put:
//     two round trips. While the hold lasts, Inspect reports that put's
//     revision as the key's token.
//   - Waiters wait in line (core.Queuer). A waiting Acquire's attempt that
//     is not granted puts, in the same transaction, its waiter key
//     <prefix> NUL "q" NUL <key> NUL <waiter> bound to the Backend's
//     waiter lease (one per WaiterTTL, of that TTL plus a second, kept
//     alive by the attempts of its waiters), so a dead process's places
//     go with its lease; a waiter of a live process that stops trying (an
//     Acquire whose Leave was lost in an outage) has its key deleted by
//     its Backend once its WaiterTTL has passed without an attempt, since
//     the other waiters' attempts keep the lease alive. The line is the order of the waiter keys'
//     create_revision, as in concurrency.Mutex. A claim's transaction
//     checks its turn atomically: a waiter whose key has create_revision r
//     requires its key unchanged and every waiter key of the key to have
//     a create_revision of at least r (a compare over the queue range);
//     a claim without a place requires the queue empty. A claim deletes
//     its waiter key in the same transaction. A semaphore
//     waiter may claim when fewer waiters are before it than permits are
//     free, as read with the claim's guard (waiters before it only leave).
//     Leave deletes the waiter key (in the background, until it is
//     deleted or the Backend closes, when the delete fails).
//   - Turns come from one watch per Locker on the prefix, with
//     WithRequireLeader (a member cut off from its cluster ends the watch
//     instead of going quiet, and the Locker polls until the watch is
//     back), without the previous values of changed keys. It starts right
//     after a read of every waiter key under the prefix and follows their
//     creations and deletions, so each Locker knows every key's line. The
//     release (or expiry, or ForceRelease) of a lock whose first waiter is
//     the Locker's own tells that waiter at once; a Locker whose waiters
//     are behind another's does nothing. Other deletions with the
//     Locker's waiter first (a permit, a Leave of the waiter before it)
//     are followed by a read of the key and its queue at the deletion's
//     revision; when a permit was free then, the first waiter is told. An
//     expiry tells too: the key is free, and the first waiter need not
//     wait for its poll at the holder's expiry.
//   - A release grants a lock to its first waiter. A plain lock's waiter
//     key holds the record its lock key would get, with the shared lease
//     of its TTL and its Backend's id, and every Locker's watch knows each
//     key's first waiter. The release is then one transaction: if the key
//     is still the session's, and that waiter key is still there at its
//     create_revision with none before it, put the lock key as the
//     waiter's, bound to its lease, and delete its waiter key; else delete
//     the lock key. (etcd refuses a transaction that deletes a key and
//     puts it again, so the grant puts over it, and the token is the mod
//     revision.) The waiter's Locker sees the put on its watch, keeps the
//     key for the waiter and tells it its turn; its attempt takes the
//     lease with no request, counting the session from the lease's last
//     refresh. A hand-off across processes is one write, the release, and
//     no read: with the waiter's put, two writes per acquisition. A grant
//     to a waiter that no longer waits is deleted by its Locker,
//     owner-checked; a release whose waiter's lease is gone (the store
//     refuses the whole transaction) releases again without the grant.
//   - Admin: Inspect is a read plus, for a lease lock, a read of its lease;
//     List reads the prefix in pages of 500; ForceRelease deletes exactly
//     the incarnation it read (same lease, same create revision) and never
//     revokes the holder's lease, which other sessions share; the holder learns of the loss at its next renewal.
//   - Keepalives, of claims and of renewals, travel on one LeaseKeepAlive
//     stream per Backend, opened on first use and kept open (it requires a
//     leader: a member that loses its leader ends it, and the next
//     keepalive opens another). One goroutine reads its replies.
//   - Close ends that stream, waits for its goroutine and revokes the
//     shared leases no session is bound to any more; any it cannot reach
//     expire by themselves.
//
// # Semaphores
//
// The Backend is a core.SemaphoreBackend: core.Limit(n) with n > 1 takes
// one of n permits of the key. Each permit is a key of its own,
// <prefix><key> NUL <owner token> (lock keys cannot contain NUL, so no lock
// key is ever a permit key and a key's permits are one key range), with
// the same JSON record plus the limit, bound to its session's own lease:
// renewal, release, undo, minimum hold and slots work on a permit exactly
// as on a lock key, and a Locker's renewal of locks and permits together
// stays one round trip.
//
//   - Acquire is one transaction: put the permit key if the lock key does
//     not exist and no permit key of the semaphore has a mod_revision
//     above R; otherwise read the lock key and the permits, oldest first.
//     R and the number of permits live at R come from the Backend's last
//     view of the semaphore: its last read of the permits, or its last
//     claim (R 0 for a semaphore it has not seen: the guard then says "no
//     permit keys at all"). Every permit key left at the transaction has a
//     mod_revision at most R, so it existed, and held a permit, at R:
//     deletions only lower the count, and any claim applied since R fails
//     the guard. So the transaction, which is the only place a permit is
//     created, never makes more than n holders; it is sent only when the
//     view has a permit free. When the guard fails, the read gives a fresh
//     view and, if it has a permit free, a second transaction claims it:
//     a claim costs one round trip when this Backend made the last change
//     to the semaphore (or the semaphore is free), two otherwise, plus one
//     per claim of another process that wins in between, for as long as
//     the fresh view has a permit free: claims racing for a free semaphore
//     are all granted until it is full. No transaction is started after a
//     sixth of the TTL, so that a claim that keeps losing to a churn of
//     claims and releases answers busy well before the renew deadline.
//     The lease is taken as for a lock (the shared lease,
//     refreshed if need be alongside the first transaction).
//   - A lock claim's transaction also requires the permit range to be
//     empty: one compare requires no key from the lock key to the end of
//     its permit range, which holds the lock key and exactly its permits
//     (lock keys have no NUL). A lock claim that finds permits, and a permit claim that finds
//     the lock key or permits taken with another limit, fail with
//     core.LimitMismatch and claim nothing.
//   - The fencing token of a permit is its key's create_revision, like a
//     lock's: every permit and every lock of a key is created at a new,
//     larger store revision, so tokens strictly increase per key across
//     permits and across lock use of the key.
//   - A full semaphore answers core.Busy with the permit that expires first
//     (one lease read per permit, 32 at a time).
//   - Release deletes the permit key guarded by its lease and
//     create_revision, as for a lock; the deletion tells the first waiter
//     in line through the same prefix watch.
//   - Holders reads the lock key and the permit range in one transaction
//     and then each permit's lease; Inspect describes the oldest permit,
//     List gives one Info per permit (with Info.Limit), and ForceRelease
//     deletes every permit it read, each guarded by its lease and
//     create_revision (one transaction per 128 permits).
//
// # How calls are sent
//
// A Backend's claim and release transactions share round trips when they
// meet. A call made while none is on its way is sent at once; calls made
// while others are on their way queue, and up to three goroutines of the
// Backend send what has queued as one transaction that compares nothing
// and nests each of them: one gRPC call and one Raft entry for the batch.
// Each nested transaction keeps its own compares and gets its own answer;
// a claim's fencing token is its key's create revision, which is that
// transaction's revision. Only transactions on distinct keys are nested
// in one (a transaction may not write a key twice, and nested compares are
// all made before any nested write), at most 32, within the server's limit
// of operations per transaction (WithMaxTxnOps). A transaction the server
// refuses whole before applying anything (one claim's lease not found, say)
// is sent again as its parts. With 64 goroutines on distinct keys this
// takes about a quarter of the Raft entries and half the server CPU of one
// transaction per call. A claim whose ctx ends while it is queued is never
// sent; one already sent goes on for the others of its batch, and the
// release of its owner token waits for its answer.
//
// Every lock request carries WithRequireLeader, so a member without a leader
// answers at once with an error instead of waiting (Close's revokes of unused
// leases do not: a lease they miss expires by itself).
//
// # Time
//
// etcd has no clock a client can read, and its lease TTLs are whole
// seconds with a server minimum (1.5 election timeouts, rounded up: 2 s on
// a default server).
//
//   - Lease TTLs are rounded up to whole seconds, never down; the server may
//     raise them further to its minimum. The session's local deadline still
//     comes from the TTL asked for (core's rule: the send time of the last
//     successful renewal plus the renew deadline; for a claim on a shared
//     lease that was not refreshed for it, that much earlier as the lease
//     is older than the claim: see Acquire above), so rounding up only
//     makes the server keep the key longer than the holder believes it
//     holds it: a crashed holder frees its locks after up to the rounded
//     TTL plus half a second (etcd checks for expired leases twice a
//     second), not after the TTL. A TTL, slot or minimum hold longer than
//     etcd's longest lease (MaxLeaseTTL) is rejected with
//     core.ErrInvalidOption naming the option.
//   - Now is the local clock. Slot locks (core.ForSlot) therefore assume
//     that the clocks of the hosts that start the same job agree within
//     SlotTolerance: each computes the slot from its own clock. The slot's
//     end is stored in the key's value; the key's lease, of the slot's
//     remaining time plus a second rounded up, only collects it. An acquire
//     that finds a slot lock whose stored end has passed on its own clock
//     deletes exactly that key (guarded by its mod_revision) and claims it
//     afresh, with a larger token; a start whose slot is already over on
//     its clock is answered busy, so a late starter cannot run a finished
//     slot again.
//   - A minimum hold is a lease of the remaining hold rounded up: the lock
//     may stay held up to about 1.5 s longer than asked, never shorter.
//   - Holder information (core.Info) gives acquired-at on the acquirer's
//     clock. Remaining is read from the holder's lease, which etcd reports
//     in whole seconds rounded down: it is that plus half a second, at most
//     the lease's TTL.
//
// # Guarantees
//
//   - Mutual exclusion as seen by etcd's linearizable key-value store: one
//     key, one holder's lease, at any point of the store's history. etcd
//     replicates every write through Raft, so this survives the loss of a
//     minority of members without losing an acknowledged acquire.
//   - A holder that stops renewing learns it lost the lock before anyone
//     else can take it, given clocks whose rates agree: its deadline is at
//     most the renew deadline after the send time of its last successful
//     renewal, and the leader expires the lease no earlier than a full TTL
//     after it processed that renewal. (A claim that sends no keepalive
//     reports when the lease expires counted from the send of its last
//     refresh, and its deadline keeps the usual margin before that.) A new leader extends every lease
//     when it takes over, never shortens it.
//   - Fencing tokens strictly increase per key, across releases, expiries,
//     member restarts and leader changes (revisions are part of the
//     replicated store).
//   - Renewals, releases and forced releases act on the session's own lease
//     or on an exact key revision: a stale session never renews or frees a
//     newer holder's lock. A reused lease carries at most one key at a time,
//     and a renewal checks the key's create_revision as well as its lease.
//
// # What is not guaranteed
//
//   - etcd before 3.7 lets a leader that is stuck or cut off from its
//     cluster keep answering keepalives for a while (etcd-io/etcd#15247),
//     which can extend the holder's deadline past the lease's expiry on
//     the new leader. Use etcd 3.7 or later where that matters.
//   - Restoring a snapshot without --bump-revision (etcdutl snapshot
//     restore) can move revisions back, and with them fencing tokens.
//   - Slot locks rely on the hosts' clocks, as above; lease locks do not.
//   - A lease is not a fence. Pass Session.Token to the resource you protect
//     and have it reject tokens smaller than the largest it has seen.
//
// A Backend renews and releases by the leases it granted itself, which it
// keeps in memory by owner token; a release of a lock taken elsewhere finds
// the lease by reading the key and checking its owner token.
package etcdlock
