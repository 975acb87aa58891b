package chaos

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

// msec is a millisecond, for the hand-written histories below.
const msec = time.Millisecond

// windowHistory: a fault under way from 1s to 5s; A acquires at 2s on a
// master the fault is about to discard, B gets the key at 2.5s, and A is
// told of its loss at lostAt.
func windowHistory(stateLoss bool, lostAt time.Duration) History {
	return History{Events: []Event{
		{At: 1000 * msec, Kind: FaultStart, Fault: "failover", StateLoss: stateLoss},
		{At: 1900 * msec, Kind: AcquireStart, Contender: "a", Key: "k"},
		{At: 2000 * msec, Kind: AcquireOK, Contender: "a", Key: "k", Hold: 1, Token: 10, Deadline: 9000 * msec},
		{At: 2200 * msec, Kind: AcquireStart, Contender: "b", Key: "k"},
		{At: 2500 * msec, Kind: AcquireOK, Contender: "b", Key: "k", Hold: 2, Token: 20, Deadline: 3500 * msec},
		{At: 2900 * msec, Kind: WorkStopped, Contender: "b", Key: "k", Hold: 2},
		{At: 2900 * msec, Kind: ReleaseStart, Contender: "b", Key: "k", Hold: 2},
		{At: 2950 * msec, Kind: HoldEnd, Contender: "b", Key: "k", Hold: 2},
		{At: lostAt, Kind: Lost, Contender: "a", Key: "k", Hold: 1, Token: 10},
		{At: lostAt + 10*msec, Kind: WorkStopped, Contender: "a", Key: "k", Hold: 1},
		{At: lostAt + 10*msec, Kind: ReleaseStart, Contender: "a", Key: "k", Hold: 1},
		{At: lostAt + 20*msec, Kind: HoldEnd, Contender: "a", Key: "k", Hold: 1},
		{At: 5000 * msec, Kind: FaultEnd, Fault: "failover"},
	}}
}

// Rule: an overlap inside a state-loss fault's window is allowed when the
// earlier holder was told within the renew deadline of the later one's
// acquisition (or of the fault's end), and Check reports it among the
// excused ones (the failover tier counts them as double grants); a late
// signal, or a fault that loses no state, leaves it a violation.
func TestCheckFaultWindows(t *testing.T) {
	cfg := Config{RenewDeadline: time.Second, Slack: 100 * msec, LossSlack: 400 * msec}
	for _, c := range []struct {
		name      string
		stateLoss bool
		lostAt    time.Duration
		allowed   bool
	}{
		{"told in time", true, 3000 * msec, true},
		{"told too late", true, 3700 * msec, false},
		{"no state loss", false, 3000 * msec, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			rep := Check(windowHistory(c.stateLoss, c.lostAt), cfg)
			count := func(vs []Violation) int {
				n := 0
				for _, v := range vs {
					if v.Rule == RuleOverlap {
						n++
					}
				}
				return n
			}
			kept, allowed := count(rep.Violations), count(rep.Excused)
			if kept+allowed != 1 || (allowed == 1) != c.allowed {
				t.Errorf("%d overlaps kept, %d allowed; want the one overlap allowed: %v\n%s", kept, allowed, c.allowed, rep)
			}
		})
	}
}

// fakeSession is a witness's session whose Err is fixed.
type fakeSession struct {
	core.Session
	err error
}

func (s fakeSession) Err() error { return s.err }

// Deadline has passed: measure waits for no fake session.
func (s fakeSession) Deadline() time.Time { return time.Time{} }

func (s fakeSession) Done() <-chan struct{} { return nil }

// Rule: the witness's figures count the acknowledged locks the store lost,
// how far before the fault they reach, when locking worked again, token
// regressions, and holders whose session outlived their lock.
func TestWitnessMeasure(t *testing.T) {
	w := &witness{}
	present := map[string]uint64{}
	// One attempt every 100ms: ok before the fault (the one at 900ms lost
	// to it), failing from 1000ms to 1400ms, ok again from 1500ms.
	for i := range 25 {
		start := time.Duration(i) * 100 * msec
		tr := witnessTry{key: fmt.Sprintf("w%02d", i), start: start, end: start + 10*msec, ok: i < 10 || i >= 15}
		if tr.ok {
			tr.token = uint64(100 + i)
			tr.s = fakeSession{}
			if i != 9 {
				present[tr.key] = tr.token
			}
		}
		w.tries = append(w.tries, tr)
	}
	look := func(_ context.Context, keys []string) (map[string]uint64, error) {
		out := map[string]uint64{}
		for _, k := range keys {
			if v, ok := present[k]; ok {
				out[k] = v
			}
		}
		return out, nil
	}
	hist := History{Events: []Event{{At: 1000 * msec, Kind: FaultStart, Fault: "f"}, {At: 1500 * msec, Kind: FaultEnd, Fault: "f"}}}

	figs := w.measure(t, hist, look)
	want := faultFigures{Fault: "f", Acked: 10, Lost: 1, LostBefore: 1, Reach: 90 * msec, Suffix: true,
		Recovery: 510 * msec, Unaware: 1}
	if len(figs) != 1 || figs[0] != want {
		t.Fatalf("figures = %+v, want %+v", figs, want)
	}

	// The lost holder told of its loss, and a token that went backwards.
	w.tries[9].s = fakeSession{err: core.ErrLeaseLost}
	w.tries[20].token = 50
	present[w.tries[20].key] = 50
	figs = w.measure(t, hist, look)
	if f := figs[0]; f.Unaware != 0 || f.LostSeen != 1 || f.Regressions != 1 {
		t.Errorf("figures = %+v, want 0 unaware, 1 told, 1 regression", f)
	}
}
