package chaos

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

// The failover and crash tier: real topologies (a Sentinel-managed master
// and replica, a Redis Cluster with a replica per master, a private
// PostgreSQL server) whose masters are failed over or whose server is
// crashed while holders and waiters run. Faults come in a fixed order, not
// drawn by a seed; every run is checked by Check, and a witness measures
// what each fault lost.

// stepFault is one fault of a failover or crash run.
type stepFault struct {
	name string
	// stateLoss: the fault may lose acknowledged writes (asynchronous
	// replication, a crash under asynchronous commit or of an unlogged
	// table), so the checker allows the overlaps that Check documents.
	stateLoss bool
	run       func(ctx context.Context) error
}

// runSteps runs cfg.contenders contenders on keys (acquire, hold for up to
// a TTL, release; the others wait in Acquire meanwhile) while faults are
// applied one after another, gap apart. Then the store must answer
// (env.probe), every contender must acquire again, every Locker closes and
// no key may stay held. It checks the history and returns the report.
func runSteps(t *testing.T, cfg runConfig, env *backendEnv, keys []string, rec *Recorder, logs *sink,
	gap time.Duration, faults []stepFault) (Report, []Violation) {
	t.Helper()
	r, cancel := newRun(t, cfg, env, keys, rec, logs)
	defer cancel()
	cr := r.startCrowd(cancel)

	for _, f := range faults {
		sleepCtx(r.ctx, gap)
		rec.Add(Event{Kind: FaultStart, Fault: f.name, StateLoss: f.stateLoss})
		fctx, fcancel := context.WithTimeout(r.ctx, 60*time.Second)
		err := f.run(fctx)
		fcancel()
		rec.Add(Event{Kind: FaultEnd, Fault: f.name})
		if err != nil {
			t.Errorf("fault %s: %v", f.name, err)
		}
	}
	r.awaitHealed(15 * time.Second)
	sleepCtx(r.ctx, gap)
	cr.stop()

	hist, rep := r.check()
	allowed := rep.Excused
	if len(allowed) > 0 {
		longest := time.Duration(0)
		for _, v := range allowed {
			if v.Rule == RuleOverlap {
				longest = max(longest, v.A.End-v.B.OK)
			}
		}
		t.Logf("%s: %d violations allowed by a state-loss fault under way (longest overlap %v):\n%s",
			env.name, len(allowed), longest.Round(time.Millisecond), Report{Violations: allowed})
	}
	checkNoSecret(t, env.name+" run", logs.String(), historyText(hist))
	return rep, allowed
}

// tokenRegressions counts the violations of the token rules in rep.
func tokenRegressions(rep Report) int {
	n := 0
	for _, v := range rep.Violations {
		if v.Rule == RuleTokenOrder || v.Rule == RuleTokenReuse || v.Rule == RuleFenceOrder || v.Rule == RuleStaleFenced {
			n++
		}
	}
	return n
}

// witnessTiming is the lease of the witness's locks: a long TTL, so that a
// lock the store still has is still there when it is looked up after the
// fault, and renewals every second, so that each holder has heard from the
// store again by then.
var witnessTiming = []core.Option{core.TTL(20 * time.Second), core.RenewInterval(time.Second), core.RenewDeadline(10 * time.Second)}

// witness takes a fresh lock every few milliseconds and keeps it, from
// before the first fault until after the last, so that every acknowledged
// acquisition can be looked up in the store afterwards: which survived the
// fault, which the fault lost, when locking worked again, and whether each
// holder's view (Session.Err) agrees with the store.
type witness struct {
	rec    *Recorder
	l      core.Locker
	prefix string
	every  time.Duration
	mu     sync.Mutex
	tries  []witnessTry
	stop   chan struct{}
	done   chan struct{}
}

// witnessTry is one acquisition attempt of the witness.
type witnessTry struct {
	key        string
	start, end time.Duration // recorder offsets; end is when the reply came
	ok         bool
	token      uint64
	s          core.Session
}

// startWitness builds the witness's Locker with newLocker (its errors go
// to logs) and starts the witness on it, trying a lock every every. end
// halts the witness and closes its Locker.
func startWitness(t *testing.T, rec *Recorder, logs *sink, prefix string, every time.Duration,
	newLocker func(context.Context, ...core.ClientOption) (core.Locker, func() error, error)) (w *witness, end func()) {
	t.Helper()
	l, closeL, err := newLocker(context.Background(), core.WithObserver(&errObserver{errs: logs}))
	if err != nil {
		t.Fatal(err)
	}
	w = &witness{rec: rec, l: l, prefix: prefix, every: every, stop: make(chan struct{}), done: make(chan struct{})}
	go w.loop()
	return w, func() {
		w.halt()
		if err := closeL(); err != nil {
			t.Errorf("close the witness: %v", err)
		}
	}
}

func (w *witness) loop() {
	defer close(w.done)
	tick := time.NewTicker(w.every)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-w.stop:
			return
		case <-tick.C:
		}
		key := fmt.Sprintf("%sw%05d", w.prefix, i)
		start := w.rec.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		s, err := w.l.TryAcquire(ctx, key, witnessTiming...)
		cancel()
		tr := witnessTry{key: key, start: start, end: w.rec.Now(), ok: err == nil, s: s}
		if s != nil {
			tr.token = s.Token()
		}
		w.mu.Lock()
		w.tries = append(w.tries, tr)
		w.mu.Unlock()
	}
}

// halt stops taking locks (the ones held stay held).
func (w *witness) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

func (w *witness) snapshot() []witnessTry {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]witnessTry(nil), w.tries...)
}

// lookup returns the fencing token the store has for each key it holds
// (expired or not), looked up directly.
type lookup func(ctx context.Context, keys []string) (map[string]uint64, error)

// faultFigures is what one fault did, as the witness saw it.
type faultFigures struct {
	Fault string
	// Acked: acquisitions the witness had acknowledged by the fault's start.
	Acked int
	// Lost: acknowledged acquisitions (before the fault or during it) the
	// store no longer had afterwards; LostBefore of them were acknowledged
	// before the fault started, the earliest of them Reach before it.
	Lost, LostBefore int
	Reach            time.Duration
	// Suffix: the lost acquisitions were the last ones acknowledged before
	// locking worked again (none was lost from the middle).
	Suffix bool
	// Recovery: from the fault's start until the first acquisition after
	// which every attempt succeeded and stuck; -1 when that never happened.
	Recovery time.Duration
	// Regressions: witness tokens that did not exceed the one acknowledged
	// before them (tokens of fresh keys, from the store's clock or sequence).
	Regressions int
	// Unaware: holders whose session was still valid at its deadline
	// although the store no longer had their lock (must be 0).
	Unaware int
	// LostSeen: holders that learned of their loss (Session.Err).
	LostSeen int
}

func (f faultFigures) String() string {
	rec := "never"
	if f.Recovery >= 0 {
		rec = f.Recovery.Round(time.Millisecond).String()
	}
	return fmt.Sprintf("%s: %d acquisitions acknowledged before it, %d lost (%d acknowledged before the fault, reaching back %v; last ones only: %v), locking worked again after %s, %d token regressions, %d holders unaware of a loss, %d told of their loss",
		f.Fault, f.Acked, f.Lost, f.LostBefore, f.Reach.Round(time.Millisecond), f.Suffix, rec, f.Regressions, f.Unaware, f.LostSeen)
}

// measure looks every acknowledged witness lock up in the store and
// attributes what is missing to the faults (each fault owns the attempts
// from halfway after the previous fault's end up to halfway after its own
// end). The faults' times come from hist.
func (w *witness) measure(t *testing.T, hist History, look lookup) []faultFigures {
	t.Helper()
	tries := w.snapshot()
	var keys []string
	for _, tr := range tries {
		if tr.ok {
			keys = append(keys, tr.key)
		}
	}
	have := map[string]uint64{}
	for i := 0; i < len(keys); i += 500 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		m, err := look(ctx, keys[i:min(i+500, len(keys))])
		cancel()
		if err != nil {
			t.Fatalf("look the witness's locks up: %v", err)
		}
		for k, v := range m {
			have[k] = v
		}
	}
	type span struct {
		name       string
		start, end time.Duration
	}
	var spans []span
	for _, e := range hist.Events {
		switch e.Kind {
		case FaultStart:
			spans = append(spans, span{name: e.Fault, start: e.At, end: -1})
		case FaultEnd:
			for i := range spans {
				if spans[i].name == e.Fault && spans[i].end < 0 {
					spans[i].end = e.At
				}
			}
		}
	}
	good := func(tr witnessTry) bool { return tr.ok && have[tr.key] == tr.token }
	var figs []faultFigures
	for i, sp := range spans {
		from, to := time.Duration(0), time.Duration(1<<62)
		if i > 0 {
			from = spans[i-1].end + (sp.start-spans[i-1].end)/2
		}
		if i+1 < len(spans) {
			to = sp.end + (spans[i+1].start-sp.end)/2
		}
		f := faultFigures{Fault: sp.name, Recovery: -1, Suffix: true}
		lastBad, firstLost := -1, -1
		var prevTok uint64
		for j, tr := range tries {
			if tr.end < sp.start && tr.ok {
				f.Acked++
			}
			if tr.start < from || tr.start >= to {
				continue
			}
			if tr.ok {
				if prevTok != 0 && tr.token <= prevTok {
					f.Regressions++
				}
				prevTok = tr.token
			}
			if !good(tr) {
				lastBad = j
			}
			if tr.ok && !good(tr) {
				f.Lost++
				if firstLost < 0 {
					firstLost = j
				}
				if tr.end < sp.start {
					f.LostBefore++
					f.Reach = max(f.Reach, sp.start-tr.end)
				}
			}
			if tr.ok {
				if tr.s.Err() == nil && !good(tr) {
					// Gone from the store: the holder must be told by
					// its deadline (its renewals may still be retrying).
					timer := time.NewTimer(max(time.Until(tr.s.Deadline())+lossSlack, 0))
					select {
					case <-tr.s.Done():
					case <-timer.C:
					}
					timer.Stop()
				}
				if err := tr.s.Err(); err == nil && !good(tr) {
					f.Unaware++
				} else if err != nil && errors.Is(err, core.ErrLeaseLost) {
					f.LostSeen++
				}
			}
		}
		if firstLost >= 0 {
			// Lost ones only at the end: everything acknowledged after
			// the first lost acquisition, until locking worked again,
			// was lost too (failed attempts aside).
			for _, tr := range tries[firstLost:max(firstLost, lastBad+1)] {
				if tr.ok && good(tr) {
					f.Suffix = false
				}
			}
		}
		for _, tr := range tries[lastBad+1:] {
			if tr.start >= to {
				break
			}
			if good(tr) && tr.end >= sp.start {
				f.Recovery = tr.end - sp.start
				break
			}
			if good(tr) {
				f.Recovery = 0
				break
			}
		}
		figs = append(figs, f)
	}
	return figs
}

// figure logs one of the tier's measured figures (go test -v shows them).
func figure(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Logf("figures: "+format, args...)
}

// runPrefix makes the keys of one run unique.
func runPrefix(name string) string {
	return fmt.Sprintf("chaos-%s-%d-", name, time.Now().UnixNano()%1e9)
}
