package bench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/etcdlock/etcdtest"
	"github.com/dislock/dislock/internal/zktest"
)

// each runs bench once per contender, as sub-benchmarks named store/contender.
// reqs counts the commands (Redis) or statements (PostgreSQL) the contender's
// client has sent so far.
func each(b *testing.B, names map[string][]string, bench func(b *testing.B, st *store, which string, reqs func() int64)) {
	for _, s := range stores {
		for _, which := range names[s] {
			b.Run(s+"/"+which, func(b *testing.B) {
				st, reqs := counted(b, s)
				bench(b, st, which, reqs)
			})
		}
	}
}

// stores are the servers the benchmarks run on, in order.
var stores = []string{"redis", "pg", "mysql", "etcd", "zk"}

// counted connects to store s ("redis", "pg", "mysql", "etcd" or "zk") with
// a client that counts its requests.
func counted(b *testing.B, s string) (*store, func() int64) {
	if s == "redis" {
		h := &commandCount{}
		st := redisStore(b, h)
		st.sent = h.sent
		return st, h.cmds.Load
	}
	if s == "zk" {
		cnt := &zktest.Counter{}
		return zkStore(b, cnt), cnt.Reqs.Load
	}
	if s == "etcd" {
		cnt := &etcdtest.Counter{}
		return etcdStore(b, cnt), cnt.All
	}
	if s == "mysql" {
		var n atomic.Int64
		kinds := &statementKinds{}
		st := mysqlStoreKinds(b, &n, kinds)
		st.sent = kinds.snapshot
		return st, n.Load
	}
	t := &statementCount{}
	return pgStore(b, benchPG(b), t), t.n.Load
}

// must returns v, or panics with err: for the benchmarks' own plumbing,
// whose failure means the run is broken.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

var all = map[string][]string{"redis": redisContenders, "pg": pgContenders, "mysql": mysqlContenders,
	"etcd": etcdContenders, "zk": zkContenders}

func bg(b *testing.B) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	b.Cleanup(cancel)
	return ctx
}

// cycle returns one uncontended acquire + release of key with c's try; an
// error of either fails b.
func (c *contender) cycle(ctx context.Context, b *testing.B, key string) func() {
	return func() {
		u, err := c.try(ctx, key)
		if err != nil {
			b.Fatalf("acquire: %v", err)
		}
		if err := u(ctx); err != nil {
			b.Fatalf("release: %v", err)
		}
	}
}

// BenchmarkUncontended: one goroutine acquires and releases a free key. The
// raw round trip is measured in chunks interleaved with the lock's, so a
// change of machine load during the run affects both alike. x-rtt is the
// time of one acquire+release in raw round trips; cpu-µs/op is the client
// process's CPU time per acquire+release, srv-cpu-µs/op the server's: the
// Redis server's (INFO cpu; exact on the private server scripts/bench.sh
// starts), or that of the PostgreSQL processes serving the pool (from
// /proc, when the server runs on this machine; 10 ms ticks). On Redis,
// srv-cmds/op and srv-cmd-µs/op come from INFO commandstats (see
// cmdProfile), and the log has the profile command by command. On etcd and
// ZooKeeper, srv-writes/op is the server's writes per acquire+release
// (store.writes), read outside the timed loops.
func BenchmarkUncontended(b *testing.B) {
	each(b, all, func(b *testing.B, st *store, which string, reqs func() int64) {
		c := contenderFor(b, st, which)
		ctx := bg(b)
		key := name(which, "uncontended")
		op := c.cycle(ctx, b, key)
		op() // warm up connections and statement caches
		meanRTT(ctx, b, st.rt, 10)
		const chunk = 50
		var rttTime, opTime time.Duration
		var opReqs, opWrites int64
		var opCPU, srvCPU time.Duration
		var prof cmdProfile
		b.ResetTimer()
		for done := 0; done < b.N; {
			n := min(chunk, b.N-done)
			b.StopTimer()
			rttTime += meanRTT(ctx, b, st.rt, n) * time.Duration(n)
			var w0 int64
			if st.writes != nil {
				w0 = st.writes()
			}
			b.StartTimer()
			var srv0 time.Duration
			var stats0 map[string]cmdStat
			var sent0 map[string]int64
			if st.commands != nil {
				stats0, sent0 = must(st.commands(ctx)), st.sent()
			}
			if st.serverCPU != nil {
				srv0 = must(st.serverCPU(ctx))
			}
			reqs0, cpu0, start := reqs(), cpuTime(), time.Now()
			for range n {
				op()
			}
			opTime += time.Since(start)
			opCPU += cpuTime() - cpu0
			if st.writes != nil {
				opWrites += st.writes() - w0
			}
			if st.serverCPU != nil {
				srvCPU += must(st.serverCPU(ctx)) - srv0
			}
			if st.commands != nil {
				prof.add(stats0, must(st.commands(ctx)), sent0, st.sent())
			}
			opReqs += reqs() - reqs0
			done += n
		}
		b.StopTimer()
		b.ReportMetric(float64(opTime)/float64(rttTime), "x-rtt")
		b.ReportMetric(float64(rttTime.Microseconds())/float64(b.N), "rtt-µs")
		b.ReportMetric(float64(opReqs)/float64(b.N), "reqs/op")
		if st.writes != nil {
			b.ReportMetric(float64(opWrites)/float64(b.N), "srv-writes/op")
		}
		b.ReportMetric(float64(opCPU.Microseconds())/float64(b.N), "cpu-µs/op")
		if st.serverCPU != nil {
			b.ReportMetric(float64(srvCPU.Microseconds())/float64(b.N), "srv-cpu-µs/op")
		}
		if st.commands != nil {
			prof.report(b)
		}
	})
}

// cmdProfile sums the deltas of INFO commandstats over the measured chunks
// of a benchmark.
type cmdProfile struct {
	stats map[string]cmdStat // server: calls and µs by command
	sent  map[string]int64   // client: commands sent by name
}

func (p *cmdProfile) add(stats0, stats1 map[string]cmdStat, sent0, sent1 map[string]int64) {
	if p.stats == nil {
		p.stats, p.sent = map[string]cmdStat{}, map[string]int64{}
	}
	for k, v := range stats1 {
		d := p.stats[k]
		d.calls += v.calls - stats0[k].calls
		d.usec += v.usec - stats0[k].usec
		p.stats[k] = d
	}
	for k, v := range sent1 {
		p.sent[k] += v - sent0[k]
	}
}

// report reports srv-cmds/op, every command the server executed per
// operation (a script's inner commands included), and srv-cmd-µs/op, the
// server's time in the commands the client sent (a script's time includes
// its inner commands; commandstats counts execution only, not reading and
// writing the connection, which INFO cpu's srv-cpu-µs/op includes). The
// profile, command by command, goes to the log.
func (p *cmdProfile) report(b *testing.B) {
	n := float64(b.N)
	var calls int64
	var usec float64
	var names []string
	for k, v := range p.stats {
		if v.calls == 0 {
			continue
		}
		names = append(names, k)
		calls += v.calls
		// The share of the command's calls the client sent itself; the
		// rest ran inside scripts, whose time already includes them.
		share := min(1, float64(p.sent[k])/float64(v.calls))
		usec += float64(v.usec) * share
	}
	slices.Sort(names)
	var prof strings.Builder
	for _, k := range names {
		v := p.stats[k]
		fmt.Fprintf(&prof, " %s %.2f×%.2fµs", k, float64(v.calls)/n, float64(v.usec)/float64(v.calls))
	}
	b.Logf("per op (calls × µs per call):%s", prof.String())
	b.ReportMetric(float64(calls)/n, "srv-cmds/op")
	b.ReportMetric(usec/n, "srv-cmd-µs/op")
}

// BenchmarkParallelDistinctKeys: 64 goroutines, each acquiring and
// releasing its own key. x-rtt is acquire+release pairs per second divided
// by raw round trips per second from 64 goroutines on the same client;
// srv-cpu-µs/op (here and in BenchmarkHotKey) is the server's CPU time per
// op, as in BenchmarkUncontended, the round trips' rounds left out.
func BenchmarkParallelDistinctKeys(b *testing.B) {
	each(b, all, func(b *testing.B, st *store, which string, _ func() int64) {
		c := parallelContenderFor(b, st, which)
		keys := make([]string, parallelism)
		for i := range keys {
			keys[i] = name(which, "distinct", fmt.Sprint(i))
		}
		perSec := parallelVsRTT(b, st, func(ctx context.Context, w int) error {
			u, err := c.try(ctx, keys[w])
			if err != nil {
				return err
			}
			return u(ctx)
		})
		b.ReportMetric(perSec, "pairs/s")
	})
}

// BenchmarkHotKey: 64 goroutines of one process try-lock one key, releasing
// when they get it. x-rtt is attempts per second divided by raw round trips
// per second from 64 goroutines. dislock answers the tries made while one of
// the goroutines holds the key from that session, without a store call; see
// BenchmarkBusyElsewhere for a holder in another process.
// acq/try is the share of the tries that won. On a store that counts its
// writes, busy-srv-writes/try is the server's writes per failed try
// (busyWrites).
func BenchmarkHotKey(b *testing.B) {
	each(b, all, func(b *testing.B, st *store, which string, _ func() int64) {
		if st.name == "zk" && which == "zklock" {
			b.Skip("zk.Lock has no try-lock")
		}
		c := parallelContenderFor(b, st, which)
		key := name(which, "hot")
		var won atomic.Int64
		perSec := parallelVsRTT(b, st, func(ctx context.Context, _ int) error {
			u, err := c.try(ctx, key)
			if errors.Is(err, errBusy) {
				return nil
			}
			if err != nil {
				return err
			}
			won.Add(1)
			return u(ctx)
		})
		b.ReportMetric(perSec*float64(won.Load())/float64(b.N), "acq/s")
		b.ReportMetric(float64(won.Load())/float64(b.N), "acq/try")
		if st.writes != nil {
			busyWrites(b, st, which, c, key)
		}
	})
}

// BenchmarkBusyElsewhere: another process (a contender of its own) holds
// the key for the whole run; 64 goroutines of this one try-lock it. x-rtt is
// failed tries per second divided by raw round trips per second from 64
// goroutines: the cost of a busy answer from the store. (In BenchmarkHotKey
// the holder is one of the trying goroutines, whose tries dislock answers
// from the holding session, without a store call.)
func BenchmarkBusyElsewhere(b *testing.B) {
	each(b, all, func(b *testing.B, st *store, which string, _ func() int64) {
		if st.name == "zk" && which == "zklock" {
			b.Skip("zk.Lock has no try-lock")
		}
		ctx := bg(b)
		key := name(which, "busy-elsewhere")
		u, err := contenderFor(b, st, which).try(ctx, key)
		if err != nil {
			b.Fatalf("hold the key: %v", err)
		}
		defer func() {
			if err := u(ctx); err != nil {
				b.Errorf("release the key: %v", err)
			}
		}()
		c := parallelContenderFor(b, st, which)
		parallelVsRTT(b, st, func(ctx context.Context, _ int) error {
			_, err := c.try(ctx, key)
			if errors.Is(err, errBusy) {
				return nil
			}
			if err == nil {
				return errors.New("a try won a key held by another process")
			}
			return err
		})
	})
}

// busyTries is how many failed tries busyWrites counts.
const busyTries = 100

// busyWrites reports busy-srv-writes/try: the server's writes per failed
// try, as busyTries tries in a row by another contender (another process)
// while c holds key. The hot loop's srv-writes/op mixes the failed tries
// with the acquisitions and releases of the tries that won.
func busyWrites(b *testing.B, st *store, which string, c *contender, key string) {
	ctx := bg(b)
	u, err := c.try(ctx, key)
	if err != nil {
		b.Fatalf("hold the hot key: %v", err)
	}
	other := contenderFor(b, st, which)
	w0 := st.writes()
	for range busyTries {
		if _, err := other.try(ctx, key); !errors.Is(err, errBusy) {
			b.Fatalf("try on a held key: %v, want busy", err)
		}
	}
	b.ReportMetric(float64(st.writes()-w0)/busyTries, "busy-srv-writes/try")
	if err := u(ctx); err != nil {
		b.Fatalf("release the hot key: %v", err)
	}
}

// parallelVsRTT runs b.N calls of op on 64 goroutines, in rounds alternating
// with as many raw round trips on the same goroutines, so that a change of
// machine load affects both alike. It reports x-rtt, op's rate divided by the
// round trips' rate, and returns op's rate per second. On a store that
// counts its writes it reports srv-writes/op, the server's writes per call
// of op, the round trips' rounds left out.
func parallelVsRTT(b *testing.B, st *store, op func(ctx context.Context, worker int) error) float64 {
	ctx := bg(b)
	const rounds = 4
	ping := func(ctx context.Context, _ int) error { return st.rt(ctx) }
	if _, err := parallelRun(ctx, parallelism, 2*parallelism, ping); err != nil { // warm up the pools
		b.Fatal(err)
	}
	var rttTime, opTime, srvCPU time.Duration
	var rttN int
	var writes int64
	b.ResetTimer()
	for r := range rounds {
		n := b.N/rounds + min(1, max(0, b.N%rounds-r)) // the calls of this round
		b.StopTimer()
		m := max(n, parallelism) // enough round trips to keep every goroutine busy
		d, err := parallelRun(ctx, parallelism, m, ping)
		if err != nil {
			b.Fatal(err)
		}
		rttTime, rttN = rttTime+d, rttN+m
		var srv0 time.Duration
		if st.serverCPU != nil {
			srv0 = must(st.serverCPU(ctx))
		}
		var w0 int64
		if st.writes != nil {
			w0 = st.writes()
		}
		b.StartTimer()
		d, err = parallelRun(ctx, parallelism, n, op)
		if err != nil {
			b.Fatal(err)
		}
		opTime += d
		b.StopTimer()
		if st.serverCPU != nil {
			srvCPU += must(st.serverCPU(ctx)) - srv0
		}
		if st.writes != nil {
			writes += st.writes() - w0
		}
		b.StartTimer()
	}
	b.StopTimer()
	perSec := float64(b.N) / opTime.Seconds()
	b.ReportMetric(perSec/(float64(rttN)/rttTime.Seconds()), "x-rtt")
	if st.serverCPU != nil {
		b.ReportMetric(float64(srvCPU.Microseconds())/float64(b.N), "srv-cpu-µs/op")
	}
	if st.writes != nil {
		b.ReportMetric(float64(writes)/float64(b.N), "srv-writes/op")
	}
	return perSec
}

// handoffContenders are those with a way to wait. dislock waits for a
// release notification; bsm/redislock polls every 10 ms (LinearBackoff);
// redsync polls with its defaults (32 tries, 50–250 ms apart); the TTL row
// polls every 10 ms; pg_advisory_lock waits on the server.
var handoffContenders = map[string][]string{
	"redis": {"dislock", "bsm", "redsync"},
	"pg":    {"dislock", "dislock-async", "ttlrow", "advisory"},
	"zk":    {"dislock", "zklock"},
	"etcd":  {"dislock", "mutex"},
	"mysql": {"dislock", "ttlrow", "getlock"},
}

// BenchmarkHandoff: 16 goroutines, each its own Locker (as 16 processes
// would be), wait for one key, hold it 1 ms, release it and queue again once
// another has taken it. Latency is from
// the start of Release to the return of the next holder's acquire; p50-x-rtt
// and p99-x-rtt divide it by the mean raw round trip. cpu-µs/acq is the
// process's CPU time per acquisition, all 16 contenders together (their
// store clients included, not the store): on a machine whose cores the
// store shares, a client's CPU slows the store's answers. reqs/acq counts the
// client's commands (Redis) or statements (PostgreSQL, MySQL) per
// acquisition, polling included; steady-reqs/acq the same between the same
// acquisitions as steady-srv-writes/acq below (each contender's first wait,
// which starts its Locker's release subscription, left out); on MySQL and
// Redis the log has both by kind. srv-writes/acq (a store that counts its writes) is over
// the whole run; steady-srv-writes/acq leaves out the first 16
// acquisitions, in which each contender uses the key for the first time,
// and the last 16, after which the goroutines stop queueing again.
func BenchmarkHandoff(b *testing.B) {
	for _, s := range stores {
		for _, which := range handoffContenders[s] {
			b.Run(s+"/"+which, func(b *testing.B) {
				st, reqs := counted(b, s)
				handoff(b, st, which, reqs)
			})
		}
	}
}

func handoff(b *testing.B, st *store, which string, reqs func() int64) {
	ctx := bg(b)
	cs := make([]*contender, waiters)
	for i := range cs {
		cs[i] = contenderFor(b, st, which)
	}
	key := name(which, "handoff")
	u, err := cs[0].wait(ctx, key) // warm up
	if err != nil {
		b.Fatal(err)
	}
	if err := u(ctx); err != nil {
		b.Fatal(err)
	}
	rttBefore := meanRTT(ctx, b, st.rt, 250)

	reqs0 := reqs()
	var sent0 map[string]int64
	if st.sent != nil {
		sent0 = st.sent()
	}
	var writes0 int64
	var steady0, steady1 int64                    // the server's writes at acquisition 16 and 16 before the end
	var steadyReqs0, steadyReqs1 int64            // the requests then
	var steadySent0, steadySent1 map[string]int64 // the requests by kind then
	if st.writes != nil {
		writes0 = st.writes()
	}
	// at records the counts at the first and last acquisition of the
	// steady state (see the doc above).
	at := func(acquired int) {
		if b.N <= 4*waiters {
			return
		}
		switch acquired {
		case waiters:
			// Every goroutine has acquired once: the first use
			// of the key by each contender is behind.
			steadyReqs0 = reqs()
			if st.writes != nil {
				steady0 = st.writes()
			}
			if st.sent != nil {
				steadySent0 = st.sent()
			}
		case b.N - waiters:
			// The goroutines still queue again (the last ones
			// do not): as many waiters in line as at steady0.
			steadyReqs1 = reqs()
			if st.writes != nil {
				steady1 = st.writes()
			}
			if st.sent != nil {
				steadySent1 = st.sent()
			}
		}
	}
	b.ResetTimer()
	cpu0 := cpuTime()
	samples, err := handoffs(ctx, cs, key, b.N, at)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	// Counted before the closing round trips, which go through the
	// counted pool on some stores (mysql) and are no requests of the
	// hand-off.
	reqsN, cpuN := reqs(), cpuTime()
	if st.sent != nil {
		logPerAcquisition(b, "", b.N, sent0, st.sent())
		if steadySent1 != nil {
			logPerAcquisition(b, "steady ", b.N-2*waiters, steadySent0, steadySent1)
		}
	}
	rtt := (rttBefore + meanRTT(ctx, b, st.rt, 250)) / 2 // round trips before and after
	slices.Sort(samples)
	p50, p90, p99 := percentile(samples, 50), percentile(samples, 90), percentile(samples, 99)
	b.ReportMetric(ms(p50), "p50-ms")
	b.ReportMetric(ms(p90), "p90-ms")
	b.ReportMetric(ms(p99), "p99-ms")
	b.ReportMetric(float64(p50)/float64(rtt), "p50-x-rtt")
	b.ReportMetric(float64(p99)/float64(rtt), "p99-x-rtt")
	b.ReportMetric(float64(reqsN-reqs0)/float64(b.N), "reqs/acq")
	b.ReportMetric(float64((cpuN-cpu0).Microseconds())/float64(b.N), "cpu-µs/acq")
	if steadyReqs1 > 0 {
		b.ReportMetric(float64(steadyReqs1-steadyReqs0)/float64(b.N-2*waiters), "steady-reqs/acq")
	}
	if st.writes != nil {
		w := st.writes()
		b.ReportMetric(float64(w-writes0)/float64(b.N), "srv-writes/acq")
		if steady1 > 0 {
			b.ReportMetric(float64(steady1-steady0)/float64(b.N-2*waiters), "steady-srv-writes/acq")
		}
	}
}

// handoffs runs n acquisitions of key by the contenders cs, each on a
// goroutine of its own that waits for the key, holds it holdFor, releases
// it and queues again once another has taken it. It returns the latency of
// each hand-off (from the start of a Release to the return of the next
// holder's acquire: n-1 of them), in their order. at, when not nil, is called after
// each acquisition with the number so far, in their order.
func handoffs(ctx context.Context, cs []*contender, key string, n int, at func(acquired int)) ([]time.Duration, error) {
	var (
		mu         sync.Mutex
		turn       = sync.NewCond(&mu)
		acquired   int // acquisitions so far
		releasedAt time.Time
		samples    = make([]time.Duration, 0, n)
		remaining  atomic.Int64
		wg         sync.WaitGroup
		errs       = make([]error, len(cs))
	)
	remaining.Store(int64(n))
	for g := range cs {
		wg.Go(func() {
			// fail records err and lets the others finish.
			fail := func(err error) {
				errs[g] = err
				mu.Lock()
				acquired = n
				turn.Broadcast()
				mu.Unlock()
			}
			for remaining.Add(-1) >= 0 {
				u, err := cs[g].wait(ctx, key)
				if err != nil {
					fail(err)
					return
				}
				now := time.Now()
				mu.Lock()
				if !releasedAt.IsZero() {
					samples = append(samples, now.Sub(releasedAt))
				}
				acquired++
				mine := acquired
				if at != nil {
					at(acquired)
				}
				turn.Broadcast()
				mu.Unlock()
				time.Sleep(holdFor)
				mu.Lock()
				releasedAt = time.Now()
				mu.Unlock()
				if err := u(ctx); err != nil {
					fail(err)
					return
				}
				// Join the back of the queue: wait until someone else has
				// taken the lock, so that every sample is a hand-off from
				// one holder to a waiter, never a holder taking it again.
				mu.Lock()
				for acquired == mine && acquired < n {
					turn.Wait()
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return samples, errors.Join(errs...)
}

// logPerAcquisition logs the requests per acquisition by kind (command or
// statement), from the counts before and after n acquisitions.
func logPerAcquisition(b *testing.B, what string, n int, before, after map[string]int64) {
	kinds := slices.Sorted(maps.Keys(after))
	var line strings.Builder
	for _, k := range kinds {
		if d := after[k] - before[k]; d > 0 {
			fmt.Fprintf(&line, "  %s %.3f", k, float64(d)/float64(n))
		}
	}
	b.Logf("%srequests per acquisition by kind:%s", what, line.String())
}

// heldWindow times b.N windows of the held leases' renewals.
func heldWindow(b *testing.B) time.Duration {
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		time.Sleep(window * renewInterval)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	return elapsed
}

// Sizes of BenchmarkHold1000.
const (
	leases        = 1000
	holdTTL       = 3 * time.Second
	renewInterval = holdTTL / 3 // dislock's default for holdTTL
	window        = 4           // renew intervals measured per b.N
)

var holdContenders = map[string][]string{
	"redis": {"dislock", "bsm", "redsync"},
	"pg":    {"dislock", "ttlrow"},
	"zk":    {"dislock", "zklock"},
	"etcd":  {"dislock", "mutex"},
	"mysql": {"dislock", "ttlrow"},
}

// BenchmarkHold1000 holds 1,000 leases of a 3 s TTL, renewed every second:
// by dislock's renewer, or by calling the library's Refresh/Extend on each
// lock every interval, one goroutine per lock, as users of bsm/redislock and
// redsync do. It reports, per renew interval, the commands the server
// executed (Redis INFO commandstats; PostgreSQL xact_commit of the run's own
// database), the client's round trips (Redis; a pipeline counts once) or
// statements (PostgreSQL), and the client's CPU time per lock and second.
func BenchmarkHold1000(b *testing.B) {
	for _, s := range stores {
		for _, which := range holdContenders[s] {
			b.Run(s+"/"+which, func(b *testing.B) { hold(b, s, which) })
		}
	}
}

// holdRuns numbers the runs of hold, for fresh keys in each.
var holdRuns atomic.Int64

// takeHeld takes the leases of a run of hold with take, each on a key of
// its own, 16 at a time, and fails b on the first error.
func takeHeld(ctx context.Context, b *testing.B, which string, take func(ctx context.Context, key string) error) {
	keys := make([]string, leases)
	iter := fmt.Sprint(holdRuns.Add(1)) // -count > 1: the last run's TTL rows may still be held
	for i := range keys {
		keys[i] = name(which, "hold", iter, fmt.Sprint(i))
	}
	var next atomic.Int64
	if _, err := parallelRun(ctx, 16, leases, func(ctx context.Context, _ int) error {
		return take(ctx, keys[next.Add(1)-1])
	}); err != nil {
		b.Fatal(err)
	}
}

// perInterval is a count that reportHeld reports per renew interval, in
// unit.
type perInterval struct {
	unit  string
	count func() int64
}

// reportHeld lets the renewals of the leases held settle into their
// rhythm, times b.N windows of them (heldWindow) and reports how much each
// count grew per renew interval.
func reportHeld(b *testing.B, counts ...perInterval) {
	time.Sleep(renewInterval * 3 / 2) // let renewals settle into their rhythm
	start := make([]int64, len(counts))
	for i, c := range counts {
		start[i] = c.count()
	}
	intervals := heldWindow(b).Seconds() / renewInterval.Seconds()
	for i, c := range counts {
		b.ReportMetric(float64(c.count()-start[i])/intervals, c.unit)
	}
}

// tryHeld is takeHeld's take for a dislock Locker: a TryAcquire of the
// hold TTL, whose session dislock's renewer keeps.
func tryHeld(l core.Locker) func(ctx context.Context, key string) error {
	return func(ctx context.Context, key string) error {
		_, err := l.TryAcquire(ctx, key, core.TTL(holdTTL))
		return err
	}
}

func hold(b *testing.B, s, which string) {
	if s == "zk" {
		zkHold(b, which)
		return
	}
	if s == "etcd" {
		etcdHold(b, which)
		return
	}
	ctx := bg(b)
	var (
		st       *store
		trips    func() int64
		server   func() (int64, error)
		settle   func() error
		tripUnit = "client-trips/interval"
		srvUnit  = "srv-cmds/interval"
	)
	if s == "redis" {
		h := &commandCount{}
		st = redisStore(b, h)
		trips = h.trips.Load
		plain := newRedis(b, st.url, nil)
		server = func() (int64, error) { return serverCommands(ctx, plain) }
		settle = func() error { return nil }
	} else if s == "mysql" {
		// The client's statements only: the shared server's counters
		// (SHOW GLOBAL STATUS) include other clients.
		var n atomic.Int64
		st = mysqlStore(b, &n)
		trips = n.Load
		tripUnit, srvUnit = "client-stmts/interval", ""
		server = func() (int64, error) { return 0, nil }
		settle = func() error { return nil }
	} else {
		t := &statementCount{}
		url := benchPG(b)
		st = pgStore(b, url, t)
		trips = t.n.Load
		tripUnit, srvUnit = "client-stmts/interval", "xact-commits/interval"
		r := newCommitReader(b, url)
		// The benchmark's own transactions after the first read: the
		// reader commits two between reads (its read and the next flush),
		// and each flushed pool connection one.
		var own int64
		started := false
		server = func() (int64, error) {
			n, err := r.read(ctx)
			if started {
				own += 2
			}
			started = true
			return n - own, err
		}
		settle = func() error {
			n, err := flushStats(ctx, st.pool)
			if started {
				own += int64(n)
			}
			return err
		}
	}
	var (
		hctx, stop = context.WithCancel(ctx)
		wg         sync.WaitGroup
		refreshErr atomic.Int64
	)
	defer func() { stop(); wg.Wait() }()
	if which == "dislock" {
		var l core.Locker
		if s == "redis" {
			l = newDislockRedis(b, st.rdb, "")
		} else if s == "mysql" {
			l = newDislockMySQL(b, st.newDB())
		} else {
			l = newDislockPG(b, st.pool)
		}
		takeHeld(ctx, b, which, tryHeld(l))
	} else {
		c := contenderFor(b, st, which)
		takeHeld(ctx, b, which, func(ctx context.Context, key string) error {
			refresh, err := c.lease(ctx, key, holdTTL)
			if err != nil {
				return err
			}
			wg.Go(func() {
				t := time.NewTicker(renewInterval)
				defer t.Stop()
				for {
					select {
					case <-hctx.Done():
						return
					case <-t.C:
						if err := refresh(hctx); err != nil && hctx.Err() == nil {
							refreshErr.Add(1)
						}
					}
				}
			})
			return nil
		})
	}
	time.Sleep(renewInterval * 3 / 2) // let renewals settle into their rhythm
	if err := settle(); err != nil {
		b.Fatal(err)
	}
	srv0, err := server()
	if err != nil {
		b.Fatal(err)
	}
	var srvCPU0 time.Duration
	if st.serverCPU != nil {
		srvCPU0 = must(st.serverCPU(ctx))
	}
	trips0, cpu0 := trips(), cpuTime()
	elapsed := heldWindow(b)
	trips1, cpu1 := trips(), cpuTime()
	if st.serverCPU != nil {
		used := must(st.serverCPU(ctx)) - srvCPU0
		b.ReportMetric(float64(used.Microseconds())/(leases*elapsed.Seconds()), "srv-cpu-µs/lock·s")
	}
	if err := settle(); err != nil {
		b.Fatal(err)
	}
	srv1, err := server()
	if err != nil {
		b.Fatal(err)
	}
	if n := refreshErr.Load(); n > 0 {
		b.Errorf("%d refreshes failed", n)
	}
	intervals := elapsed.Seconds() / renewInterval.Seconds()
	if srvUnit != "" {
		b.ReportMetric(float64(srv1-srv0)/intervals, srvUnit)
	}
	b.ReportMetric(float64(trips1-trips0)/intervals, tripUnit)
	b.ReportMetric(float64((cpu1-cpu0).Microseconds())/(leases*elapsed.Seconds()), "cpu-µs/lock·s")
	rtt := meanRTT(ctx, b, st.rt, 200)
	b.ReportMetric(float64(rtt.Microseconds()), "rtt-µs")
}
