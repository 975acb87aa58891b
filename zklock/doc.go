// Package zklock is the ZooKeeper backend of dislock, on
// github.com/go-zookeeper/zk (which has no dependencies of its own).
//
//	l, err := zklock.New(ctx, "zk1:2181,zk2:2181,zk3:2181")
//	...
//	s, err := l.TryAcquire(ctx, "nightly-report")
//
// New and NewBackend take a connect string, "host:port[,host:port…][/chroot]",
// or the zk:// URL the README and the dislock CLI use,
// "zk://[user:password@]host:port[,host:port…][/chroot][?session_timeout=SECONDS]"
// (ParseURL reads it into a connect string and options). ParseServers
// splits a connect string and refuses a URL.
//
// New and NewBackend dial their own connection, because go-zookeeper does
// not otherwise reveal the session timeout the server granted (it is taken
// from the client's "authenticated" log line). NewBackendFromConn and
// NewFromConn use a connection the caller owns, with the limits listed at
// NewBackendFromConn. go-zookeeper's calls take no context; every call of
// the backend still returns when its ctx ends (an abandoned request ends by
// itself when its reply arrives or the connection drops, and an abandoned
// claim is deleted when its reply arrives).
//
// Supported servers: ZooKeeper 3.5 and later (container nodes and multi);
// tested with 3.8.0 as standalone server and as a 3-node ensemble.
// ZooKeeper 3.6 to 3.8.0 can hold a committed write's reply until another
// request reaches the server (ZOOKEEPER-4537, fixed in 3.8.1); a call
// unanswered after 250 ms sends a read on its session, which wakes the
// server, and again at doubling intervals.
//
// # The recipe
//
// Each key has a container node <root>/locks/<encoded key>. An acquirer
// creates an ephemeral sequential claim node l-<owner token>-NNNNNNNNNN under
// it, in one multi with a write to the key node; that write's returned stat
// carries the claim's zxid, the server time and the number of children. A
// claim that is the only child holds the lock at once (one round trip);
// otherwise the lowest claim in force holds it. A busy TryAcquire deletes
// its claim again, while it reads the holder; a waiting Acquire keeps it as
// its place in line (below). A key's container node is created before the
// first claim of a key the backend has not used yet (ZooKeeper cannot
// create a container in a multi), so that the claim does not fail for the
// lack of it. A claim's name is unique per
// session, so a release, a renewal or a stale retry can only ever touch the
// node of its own session, never the next holder's; an acquire whose reply
// was lost is found and undone by its owner token. A release that finds its
// claim gone (force-released, or deleted after its TTL by a later claimer)
// answers lost (core.ErrLeaseGone). A claim whose TTL ran out but which no
// one has deleted yet is still deleted by its release without a word:
// ZooKeeper cannot compare a node's age with the server's clock in the
// delete itself, and the check would cost a round trip.
//
// # Semaphores
//
// The Backend is a core.SemaphoreBackend: core.Limit(n) with n > 1 takes
// one of n permits of the key. A permit is a claim like a lock's, in the
// same container node, named p-<n>-<owner token>-NNNNNNNNNN (its hold, for
// a minimum hold or a slot, q-<n>-<until>-<owner token>), with the same
// data, lease discipline, renewal (in the same multi as the Locker's
// locks), release and undo.
//
//   - A permit claim holds when fewer than n permits are in force below it
//     (permit claims with a lower sequence number, and permit holds), all
//     taken with limit n, and no mutex claim below it or mutex hold is in
//     force. Sequence numbers are the container's, shared by mutex and
//     permit claims. At most n hold at once: a claim's position only
//     improves (later claims get higher numbers) and a claim below it
//     stops counting only once it is gone (released, its session expired,
//     or deleted after its TTL ran out, guarded by the version judged), so
//     when the newest holder decided, all the other holders were below it
//     and counted.
//   - Round trips. Acquire is the claim's multi (create + a write to the
//     key node, whose stat says whether the claim is the only child): one
//     round trip on a free key. Otherwise a read of the children follows
//     (two): ZooKeeper cannot make a create conditional on the number or
//     the kind of its siblings, so the claim is made first and judged
//     after. When the claims below are permits of the same limit, fewer
//     than n with the permit holds, nothing else is read; otherwise they
//     are read in order (a watch on each one in force) until n are in
//     force, and a busy claim then deletes itself: busy, with the permit
//     that expires first. Release is one delete; renewal is one multi for
//     all locks and permits of the Locker.
//   - Fencing tokens are the claims' czxids, as for locks, except for a
//     permit granted after its claim was made: a waiter's place (the
//     grant rule lets a later waiter take a free permit before an earlier
//     one), or a claim judged after another permit's grant. Its grant is a
//     multi that writes the key node and rewrites the claim ("1g…", and
//     "1t<token>…" on each renewal), and its token is that write's zxid.
//     Tokens so strictly increase per key, in the order of the grants,
//     across permits and across mutex use. (Mutex grants go in line
//     order: a waiter's czxid is its token.)
//   - A permit claim that finds a mutex in force below it (or a mutex
//     hold), or permits or permit holds of another limit, and a mutex
//     claim that finds a permit in force below it (or a permit hold), fail
//     with core.LimitMismatch; their claim is deleted before the answer.
//   - Holders (and Inspect, which gives the oldest) lists the permits in
//     force as the rule above counts them, oldest first; List gives one
//     Info per permit; ForceRelease deletes every claim and hold of the
//     key. The shortcuts below that answer busy without a request apply to
//     mutexes only: a permit claim always asks the store.
//   - Waiters queue as for locks (below): a waiting permit claim is
//     told its turn when no waiting place is before it and fewer than n
//     nodes are in force below it with the permit holds; it watches the
//     nearest waiting place before it (whose grant rewrites its data) or,
//     when first, every node before it.
//
// # Waiters in line
//
// The Backend is a core.Queuer, the recipe's way. A waiting Acquire keeps
// its claim node from one attempt to the next, named l-<waiter>-NNNNNNNNNN
// (the engine's Waiter, the same on all its attempts, so that a create whose
// reply was lost is found by its name), with the data "2\n0\n<owner>"
// ("2\nn\n<owner>" when its waiter has no min hold, below) while it
// waits: its sequence number is its place in line, and the rule above
// (the lowest in force hold) lets exactly the next one in, across
// processes, in the order they came; a TryAcquire comes after every waiter
// in line. A backend that knows the key busy (it holds it, has a place in
// its line, or was answered busy within the last second) makes a mutex
// waiter's place with a plain create and the waiting data, not the claim's
// multi: its fencing token, the node's czxid, comes with the read that
// watches the node once it is next. The waiter's backend watches the node before its own and tells
// the engine its turn through WatchTurns when it is first in line; no
// other process hears of it. A place reads the children once, and then
// watches, in one round trip, its own node and the node before it: its
// data, which that node's grant changes, and its deletion (a child watch,
// which only a deletion fires). The place right behind the holder reads
// the holder (its owner and lease end, which its waiter's busy answers
// name and at whose expiry it polls), so a waiter further back is answered
// busy without a holder until it is next. A place learns that it is next
// from the grant of the node before it. When that node was a waiting
// place whose waiter has no min hold, written "2\nn\n<owner>" (never
// kept: its release leaves no hold behind), the grant's data change tells
// it all, with no read; otherwise ("2\n0\n<owner>", as a place with a
// min hold, or one written by an older version) it reads that node, which
// watches it again. When the node before it was the only one and is
// deleted, nothing can be before it any more, and the grant needs no read
// (a min hold or a slot's hold comes only from that node, in the multi
// that deletes it, after a write to it, which the data watch reports as a
// data change instead: the waiter reads the children and finds the hold;
// only for a node never kept does the child watch report the deletion).
// The grant rewrites the node as a claim ("1\n<ttl>\n<owner>"), so
// that it is judged by its TTL like any other claim from then on, and the
// fencing token is the node's czxid, which increases in the order of the
// line. A mutex's waiting place already holds the key when its grant is
// decided (it is the lowest node in force, and a place is never judged by
// a TTL), so that rewrite is sent without waiting for its reply: at its
// turn the waiter gets the lease without a round trip, and the engine
// counts the lease from before the rewrite, which the store's TTL counts
// from. (A permit's grant, and a place that still has a claim's data, wait
// for the write.) A place whose
// process died goes with its session; Leave (the Acquire gave up) deletes
// it, and so does its own backend when its WaiterTTL runs out without an
// attempt: the waiter behind is told at once, without a poll. Until its
// watch fires, a queued mutex wait's refreshes are answered busy without a
// request, except at the holder's expiry, which waiters poll for (a lease
// that runs out deletes nothing). A place is live while its session is and
// never judged by a TTL. Writes per hand-off: the waiter's create, its
// grant, and the release. A wait whose guess that the key is busy was wrong
// costs one write more (a claim rewritten as a place, or a place granted at
// once).
//
// # Guarantees
//
//   - Mutual exclusion as ZooKeeper orders writes: every claim, renewal,
//     hold and release is a write through the leader.
//   - Fencing tokens are the claim's czxid: they strictly increase per key,
//     across leader failovers too (the epoch is in the high 32 bits). Not
//     across a wiped or rebuilt ensemble, which starts again from zxid 0.
//   - Renewal is one multi of setData operations, one per lease of the
//     Locker, split every 256: a quorum write. Reads and pings may be
//     answered by a follower that is cut off from the leader; a write is
//     applied only by a leader with a quorum, only while the session lives,
//     and it stamps the claim with the server time of the renewal (mtime).
//     A check-only multi would prove the same liveness but leave no such
//     trace, and the lease discipline below needs it.
//   - Lease discipline. go-zookeeper keeps the session alive with pings even
//     when the engine stopped renewing a lease (the lease was lost locally,
//     or its release failed during a disconnect), so the session alone
//     could keep a lock forever. A claim is therefore in force only until
//     its mtime plus its TTL (both in its data and stat). An acquirer that
//     finds a lower claim whose TTL ran out deletes it, guarded by the
//     version it read, so a renewal in between wins. This is safe: the
//     holder's own renew deadline is the send time of its last successful
//     renewal plus RenewDeadline (< TTL), and that renewal's mtime is after
//     its send; so when the acquirer's write is stamped more than TTL after
//     that mtime, the holder's deadline passed at least TTL − RenewDeadline
//     earlier, given that the leader's clock runs at the rate of the
//     holder's and does not step by more than that margin. Inspect and List
//     show such a claim as free.
//   - The TTL of every lease must be at most 2/3 of the session timeout T
//     (else TryAcquire fails with core.ErrInvalidOption naming both): a
//     follower reports its sessions' activity to the leader only so often,
//     so after a renewal sent at s the leader may expire the session from
//     s + 2T/3 on. The default TTL of New is 2/3 T; ZooKeeper grants at most
//     40 s by default (20 × tickTime), so core's 30 s default does not fit.
//   - Sessions. A disconnected (suspended) connection is not yet a loss:
//     renewals fail with an unknown outcome and the engine's renew deadline
//     decides. An expired session ends every lease of that session at once:
//     its claims are gone, and since go-zookeeper opens a new session
//     without telling, each claim remembers its session and a renewal in any
//     other session reports the lease lost. (A session expires only after
//     the client was cut off for longer than its renew deadlines, so the
//     engine has by then signalled the loss of each of its leases.) A crashed holder frees its locks
//     at the latest TTL after its last renewal (an acquirer deletes the
//     claim), or when its session expires (T).
//   - Min hold and slots. A release with a min hold replaces the claim, in
//     one multi, by a persistent hold node h-<until>-<owner token>, where
//     until is on the server clock (the claim's creation plus the time held
//     plus what is left of the hold). A slot lock is taken as a claim and
//     then turned into a hold until the slot's end. Holds outlive the
//     process (the CLI exits right after its job) and lock the key while in
//     force; ended holds are deleted by the next acquirer. Their ends are on
//     the ZooKeeper leader's wall clock (Now writes <root>/clock and reads
//     its mtime).
//   - Release notifications (core.Watcher, for direct subscribers; a
//     Locker follows turns instead): a busy TryAcquire behind a
//     claim leaves a one-shot watch on the holder's claim, the one node
//     whose deletion can free the lock (behind a min-hold or slot hold there
//     is nothing to wait for but the hold's end, which the waiter's backoff
//     meets from the busy answer's remaining time), never on the key's children, whose every change would
//     wake every waiter. A renewal fires it too; the backend sets it again
//     without waking anyone. One watch per node per backend; the engine
//     wakes one waiter per notification. Waiters in different processes all
//     wake on a release and race with one attempt each. A busy acquirer
//     gives its claim up while it reads the holder, so that it stands in the
//     way of the others as briefly as possible.
//   - No request for what the backend knows: while it holds a key itself,
//     or has a TryAcquire of the key in flight, another TryAcquire (one
//     without a Waiter) of that key through the same Backend answers busy
//     at once. A waiting Acquire is never answered so: it queues, and is
//     told its turn.
//
// # Not guaranteed
//
//   - A lease is not a fence: pass Session.Token to the resource you
//     protect and have it reject smaller tokens.
//   - The guarantees above assume clocks that run at the same rate and a
//     leader clock that does not step by more than TTL − RenewDeadline; a
//     failover to a leader whose clock is off by more than that shortens or
//     stretches leases, holds and slots by the difference.
//   - Inspect's Remaining and a busy answer's holder are read at one instant
//     and may be stale at once. Inspect, List, Holders and ForceRelease
//     each sync the server they ask with the leader first, so that they
//     see every claim acknowledged before they were called, and write
//     <root>/clock once to read the server clock. One exception: a waiter
//     that got a mutex at its turn holds it before the rewrite of its place
//     as a claim reaches the store (see Waiters in line), and until then a
//     waiting place is not a holder to these calls. So for about a round
//     trip after such a hand-off, Inspect and List (from any session) may
//     show the key free, and a ForceRelease there finds no holder and leaves
//     the new one, as if it had come just before that acquisition. No other
//     claim can be granted meanwhile: the place is the lowest node in force.
//   - Without WithAuth or WithACL the nodes are open (world:anyone): see
//     Authentication and ACLs below.
//   - go-zookeeper v1.0.4 has a data race of its own: after a reconnect in
//     the same session it reads Conn.lastZxid to send the session's watches
//     again while its receive loop writes it (upstream PR #35). A busy
//     acquisition leaves a watch, so a program built with -race may report
//     it after a connection drop; it is harmless in practice and not
//     dislock's. dislock's own tests run on a copy of the client with the
//     fix (third_party/go-zookeeper-zk, through a replace in dislock's
//     go.mod, which reaches no build that depends on dislock).
//
// # Authentication and ACLs
//
// By default the session is unauthenticated and every node the backend
// creates is world:anyone with every right: anyone who can reach the
// ensemble can read, break or delete the locks. For an ensemble shared with
// others:
//
//	l, err := zklock.New(ctx, "zk1:2181,zk2:2181", zklock.WithAuth("digest", []byte("jobs:s3cret")))
//	l, err := zklock.New(ctx, "zk://jobs:s3cret@zk1:2181,zk2:2181") // the same
//
// WithAuth authenticates the session (zk.Conn.AddAuth; go-zookeeper sends
// the credentials again on every reconnect and new session, before any
// other request), and makes CreatorAllACL the default ACL: every node the
// backend creates (the root and its missing ancestors, locks, clock, each
// key's container, claims and holds) gives every right to the identity it
// was created by and none to anyone else. A session without those
// credentials then gets zk.ErrNoAuth for reading the locks, for taking
// them, and for deleting or changing any node. WithACL sets another ACL
// (zk.DigestACL for a named user, several entries for several identities);
// every identity the Lockers of a root use needs READ, WRITE, CREATE and
// DELETE. ZooKeeper sets a node's ACL only when it creates it: a root that
// an earlier, unauthenticated run created keeps world:anyone (and so does
// anything under it that exists already), so start protected Lockers on a
// new root, or change the ACLs with zk.Conn.SetACL. Credentials never
// appear in errors or log lines.
//
// Digest credentials travel in clear text unless the connection is secured
// (ZooKeeper's TLS client port, through WithDialer).
package zklock
