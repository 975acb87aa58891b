// Package bench compares dislock with the locks people use today, on the
// same servers and in the same run: github.com/bsm/redislock and
// github.com/go-redsync/redsync/v4 on Redis; a plain two-statement TTL-row
// lock and pg_try_advisory_lock on PostgreSQL; a TTL row and GET_LOCK on
// MySQL; etcd's concurrency.Mutex and go-zookeeper's zk.Lock, each on a
// private server the benchmarks start; and the raw round trip of each
// server (Redis PING, PostgreSQL SELECT 1, MySQL SELECT 1, etcd Get,
// ZooKeeper Exists).
//
// Every benchmark reports its result as a ratio to the raw round trip it
// measured itself (the x-rtt metric), so numbers from different machines can
// be compared. BenchmarkVersus also puts dislock beside its store's peer in
// one benchmark, in alternating rounds, and reports x-peer, the ratio of the
// two: on a shared machine it is steadier than two x-rtt figures measured
// seconds apart. It is a module of its own so that the competitors stay out
// of dislock users' builds. Run it all with scripts/bench.sh at the repository
// root; BENCHMARKS.md holds the numbers and how to read them.
//
// The package has no code of its own: everything is in its tests.
package bench
