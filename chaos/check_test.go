package chaos

import (
	"bytes"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// hb builds fake histories.
type hb struct{ h History }

func (b *hb) add(e Event) *hb { b.h.Events = append(b.h.Events, e); return b }

// hold appends a complete hold: acquire-start at start, ok at ok, work
// stopped and released at rel (or, when rel is 0, work stopped at its
// deadline, lost just after it and released).
func (b *hb) hold(id int64, who, key string, tok uint64, start, ok, deadline, rel int) *hb {
	b.add(Event{At: ms(start), Kind: AcquireStart, Contender: who, Key: key})
	b.add(Event{At: ms(ok), Kind: AcquireOK, Contender: who, Key: key, Hold: id, Token: tok, Deadline: ms(deadline)})
	end := rel
	if rel == 0 {
		b.add(Event{At: ms(deadline), Kind: WorkStopped, Contender: who, Key: key, Hold: id, Token: tok})
		b.add(Event{At: ms(deadline + 1), Kind: Lost, Contender: who, Key: key, Hold: id, Token: tok})
		end = deadline + 1
	} else {
		b.add(Event{At: ms(rel), Kind: WorkStopped, Contender: who, Key: key, Hold: id, Token: tok})
	}
	b.add(Event{At: ms(end), Kind: ReleaseStart, Contender: who, Key: key, Hold: id, Token: tok})
	b.add(Event{At: ms(end + 1), Kind: HoldEnd, Contender: who, Key: key, Hold: id, Token: tok, Deadline: ms(deadline)})
	return b
}

// lostWorking appends a hold that is lost at its deadline while a step of
// its work is in progress: the work stops at stopped, then it releases.
func (b *hb) lostWorking(id int64, who, key string, tok uint64, start, ok, deadline, stopped int) *hb {
	b.add(Event{At: ms(start), Kind: AcquireStart, Contender: who, Key: key})
	b.add(Event{At: ms(ok), Kind: AcquireOK, Contender: who, Key: key, Hold: id, Token: tok, Deadline: ms(deadline)})
	b.add(Event{At: ms(deadline + 1), Kind: Lost, Contender: who, Key: key, Hold: id, Token: tok})
	b.add(Event{At: ms(stopped), Kind: WorkStopped, Contender: who, Key: key, Hold: id, Token: tok})
	b.add(Event{At: ms(stopped), Kind: ReleaseStart, Contender: who, Key: key, Hold: id, Token: tok})
	b.add(Event{At: ms(stopped + 1), Kind: HoldEnd, Contender: who, Key: key, Hold: id, Token: tok, Deadline: ms(deadline)})
	return b
}

// A hold lasts until its work stopped, not until the loss signal: an engine
// that frees the key at the signal lets B in while A's last step still
// runs. The store keeping the key for the margin lets B in only after A
// stopped.
func TestCheckHoldLastsUntilWorkStopped(t *testing.T) {
	cfg := cfg
	cfg.StopSlack = ms(100)
	b := &hb{}
	b.lostWorking(1, "c1", "k", 10, 0, 5, 1005, 1040)
	b.hold(2, "c2", "k", 11, 100, 1008, 2008, 1100) // the key freed at A's loss
	b.add(Event{At: ms(1020), Kind: CounterRead, Contender: "c2", Key: "k", Hold: 2, Value: 4})
	b.add(Event{At: ms(1025), Kind: CounterWrite, Contender: "c2", Key: "k", Hold: 2, Read: 4, Value: 5})
	b.add(Event{At: ms(990), Kind: CounterRead, Contender: "c1", Key: "k", Hold: 1, Value: 4})
	b.add(Event{At: ms(1039), Kind: CounterWrite, Contender: "c1", Key: "k", Hold: 1, Read: 4, Value: 5})
	r := Check(b.history(), cfg)
	wantRules(t, r, RuleOverlap, RuleLostUpdate)
	for _, want := range []string{"loss signalled 1.006s, work stopped 1.040s", "held until 1.040s (work stopped)", "B acquired it at 1.008s", "32ms of overlap"} {
		if !strings.Contains(r.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, r)
		}
	}
	// The same history judged by the loss signal alone looks clean.
	legacy := History{Seed: 42}
	for _, e := range b.history().Events {
		if e.Kind != WorkStopped {
			legacy.Events = append(legacy.Events, e)
		}
	}
	if lr := Check(legacy, cfg); slices.Contains(rules(lr), RuleOverlap) {
		t.Fatalf("without work-stopped events the hold should end at the signal:\n%s", lr)
	}

	b = &hb{}
	b.lostWorking(1, "c1", "k", 10, 0, 5, 1005, 1040)
	b.hold(2, "c2", "k", 11, 100, 1505, 2505, 1600) // the key expired at TTL
	wantRules(t, Check(b.history(), cfg))
}

func TestCheckSlowStop(t *testing.T) {
	cfg := cfg
	cfg.StopSlack = ms(100)
	b := &hb{}
	b.lostWorking(1, "c1", "k", 10, 0, 5, 1005, 1200)
	r := Check(b.history(), cfg)
	wantRules(t, r, RuleSlowStop)
	if !strings.Contains(r.String(), "195ms after the holder had to stop (allowed 100ms)") {
		t.Errorf("report:\n%s", r)
	}
	cfg.StopSlack = 0 // not checked
	wantRules(t, Check(b.history(), cfg))
}

func (b *hb) history() History {
	h := History{Seed: 42, Events: append([]Event(nil), b.h.Events...)}
	// Sort as the recorder does.
	r := &Recorder{h: h}
	return r.History()
}

var cfg = Config{RenewDeadline: ms(1000), Slack: ms(50), LossSlack: ms(100)}

func rules(r Report) []string {
	var out []string
	for _, v := range r.Violations {
		out = append(out, v.Rule)
	}
	return out
}

func wantRules(t *testing.T, r Report, want ...string) {
	t.Helper()
	got := rules(r)
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("violations = %q, want %q\n%s", got, want, r)
	}
}

func TestCheckCleanHistory(t *testing.T) {
	b := &hb{}
	b.hold(1, "c1", "k", 10, 0, 5, 1005, 300)
	b.hold(2, "c2", "k", 11, 100, 310, 1310, 600)
	b.hold(3, "c1", "k", 12, 400, 700, 1700, 0) // lost at its deadline
	b.hold(4, "c2", "k", 13, 800, 1702, 2702, 1800)
	b.hold(5, "c1", "other", 3, 0, 5, 1005, 500) // another key may overlap
	wantRules(t, Check(b.history(), cfg))
}

// TestCheckHolderActsPastDeadline is the counterexample the suite exists to
// find: a holder whose engine never ends its session (the local deadline is
// disabled, so it keeps extending), while the store has long given the key to
// someone else.
func TestCheckHolderActsPastDeadline(t *testing.T) {
	b := &hb{}
	b.add(Event{At: ms(200), Kind: FaultStart, Fault: "cut"})
	b.hold(1, "c1", "k", 10, 0, 5, 4000, 3000) // deadline kept moving: acts until 3s
	b.add(Event{At: ms(1500), Kind: CounterRead, Contender: "c1", Key: "k", Hold: 1, Value: 7})
	b.add(Event{At: ms(1800), Kind: FaultEnd, Fault: "cut"})
	b.hold(2, "c2", "k", 11, 1000, 1600, 2600, 2000)
	b.add(Event{At: ms(1610), Kind: CounterRead, Contender: "c2", Key: "k", Hold: 2, Value: 7})
	b.add(Event{At: ms(1620), Kind: CounterWrite, Contender: "c2", Key: "k", Hold: 2, Read: 7, Value: 8})
	b.add(Event{At: ms(1700), Kind: CounterWrite, Contender: "c1", Key: "k", Hold: 1, Read: 7, Value: 8})
	r := Check(b.history(), cfg)
	wantRules(t, r, RuleOverlap, RuleLostUpdate)
	out := r.String()
	for _, want := range []string{"seed 42", "hold 1 (c1", "hold 2 (c2", "none allowed", "cut [0.200s, 1.800s]", "one increment is lost"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	t.Logf("the counterexample as printed:\n%s", out)
}

func TestCheckStateLossWindow(t *testing.T) {
	mk := func(aEnd int) History {
		b := &hb{}
		b.hold(1, "c1", "k", 10, 0, 5, aEnd, 0)
		b.add(Event{At: ms(300), Kind: FaultStart, Fault: "delete", StateLoss: true})
		b.add(Event{At: ms(301), Kind: FaultEnd, Fault: "delete"})
		b.hold(2, "c2", "k", 11, 310, 320, 1320, 900)
		return b.history()
	}
	// A learns of the deletion at its deadline, within RenewDeadline+Slack of it.
	wantRules(t, Check(mk(1200), cfg))
	// A keeps acting past the fault start + RenewDeadline + Slack.
	wantRules(t, Check(mk(1400), cfg), RuleOverlap)
}

func TestCheckNetworkFaultAllowsNoOverlap(t *testing.T) {
	b := &hb{}
	b.add(Event{At: ms(0), Kind: FaultStart, Fault: "latency"})
	b.hold(1, "c1", "k", 10, 0, 5, 1005, 0)
	b.hold(2, "c2", "k", 11, 10, 1005, 2005, 1100) // exactly at A's end: fine
	b.hold(3, "c3", "k", 12, 10, 1100, 2100, 1101) // B released at 1100: fine
	b.add(Event{At: ms(3000), Kind: FaultEnd, Fault: "latency"})
	wantRules(t, Check(b.history(), cfg))
	b.hold(4, "c4", "k", 13, 1050, 1099, 2099, 1100) // overlaps hold 2 by 1ms
	wantRules(t, Check(b.history(), cfg), RuleOverlap)
}

func TestCheckTokens(t *testing.T) {
	b := &hb{}
	b.hold(1, "c1", "k", 10, 0, 5, 1005, 100)
	b.hold(2, "c2", "k", 9, 200, 210, 1210, 300)
	wantRules(t, Check(b.history(), cfg), RuleTokenOrder)

	b = &hb{}
	b.hold(1, "c1", "k", 10, 0, 5, 1005, 100)
	b.hold(2, "c2", "k", 10, 200, 210, 1210, 300)
	wantRules(t, Check(b.history(), cfg), RuleTokenReuse)

	// Acquisitions that ran concurrently may get tokens in either order.
	b = &hb{}
	b.hold(1, "c1", "k", 11, 0, 50, 1050, 100)
	b.hold(2, "c2", "k", 10, 10, 150, 1150, 300)
	wantRules(t, Check(b.history(), cfg))
}

func TestCheckFencedRegister(t *testing.T) {
	b := &hb{}
	b.add(Event{At: ms(100), Sent: ms(90), Kind: FencedWrite, Key: "k", Hold: 1, Token: 10, Accepted: true, Value: 1})
	b.add(Event{At: ms(200), Sent: ms(190), Kind: FencedWrite, Key: "k", Hold: 2, Token: 12, Accepted: true, Value: 2})
	b.add(Event{At: ms(300), Sent: ms(290), Kind: FencedWrite, Key: "k", Hold: 1, Token: 10})
	wantRules(t, Check(b.history(), cfg))
	b.add(Event{At: ms(400), Sent: ms(390), Kind: FencedWrite, Key: "k", Hold: 1, Token: 10, Accepted: true, Value: 3})
	wantRules(t, Check(b.history(), cfg), RuleFenceOrder, RuleStaleFenced)
}

func TestCheckLossTiming(t *testing.T) {
	b := &hb{}
	b.add(Event{At: ms(0), Kind: AcquireStart, Contender: "c1", Key: "k"})
	b.add(Event{At: ms(5), Kind: AcquireOK, Contender: "c1", Key: "k", Hold: 1, Token: 1, Deadline: ms(1005)})
	b.add(Event{At: ms(1300), Kind: Lost, Contender: "c1", Key: "k", Hold: 1, Token: 1})
	b.add(Event{At: ms(1301), Kind: HoldEnd, Contender: "c1", Key: "k", Hold: 1, Deadline: ms(1005)})
	wantRules(t, Check(b.history(), cfg), RuleLossLate)

	b = &hb{}
	b.add(Event{At: ms(0), Kind: AcquireStart, Contender: "c1", Key: "k"})
	b.add(Event{At: ms(5), Kind: AcquireOK, Contender: "c1", Key: "k", Hold: 1, Token: 1, Deadline: ms(1005)})
	b.add(Event{At: ms(1200), Kind: LossMissing, Contender: "c1", Key: "k", Hold: 1})
	wantRules(t, Check(b.history(), cfg), RuleLossMissing, RuleUnfinished)
}

// A pause of the test process (Paused) is not counted against the engine's
// loss signal or the work's stop; a pause outside their window is.
func TestCheckPauseNotCounted(t *testing.T) {
	hist := func(pause ...Event) History {
		b := &hb{}
		b.add(Event{At: ms(0), Kind: AcquireStart, Contender: "c1", Key: "k"})
		b.add(Event{At: ms(5), Kind: AcquireOK, Contender: "c1", Key: "k", Hold: 1, Token: 1, Deadline: ms(1005)})
		for _, p := range pause {
			b.add(p)
		}
		b.add(Event{At: ms(2100), Kind: WorkStopped, Contender: "c1", Key: "k", Hold: 1, Token: 1})
		b.add(Event{At: ms(2130), Kind: Lost, Contender: "c1", Key: "k", Hold: 1, Token: 1})
		b.add(Event{At: ms(2131), Kind: HoldEnd, Contender: "c1", Key: "k", Hold: 1, Deadline: ms(1005)})
		return b.history()
	}
	c := cfg
	c.StopSlack = ms(300)
	wantRules(t, Check(hist(), c), RuleSlowStop, RuleLossLate)
	wantRules(t, Check(hist(Event{At: ms(2090), Kind: Paused, Sent: ms(900)}), c))
	wantRules(t, Check(hist(Event{At: ms(900), Kind: Paused, Sent: ms(100)}), c), RuleSlowStop, RuleLossLate)
}

func TestCheckActedOutsideHold(t *testing.T) {
	b := &hb{}
	b.hold(1, "c1", "k", 10, 0, 5, 1005, 500)
	b.add(Event{At: ms(400), Kind: CounterRead, Contender: "c1", Key: "k", Hold: 1})
	b.add(Event{At: ms(600), Kind: CounterWrite, Contender: "c1", Key: "k", Hold: 1, Value: 1})
	wantRules(t, Check(b.history(), cfg), RuleActedOutside)
}

func TestCheckEndOfRun(t *testing.T) {
	b := &hb{}
	b.hold(1, "c1", "k", 10, 0, 5, 1005, 100)
	b.hold(2, "c2", "k", 11, 150, 160, 1160, 200)
	b.add(Event{At: ms(300), Kind: Healed})
	b.hold(3, "c1", "k", 12, 400, 410, 1410, 500)
	b.add(Event{At: ms(2000), Kind: HeldAfterRun, Key: "k", Token: 12})
	b.add(Event{At: ms(2001), Kind: Stuck, Contender: "c3"})
	wantRules(t, Check(b.history(), cfg), RuleHeldAfterRun, RuleUnfinished, RuleNoReacquire)
}

func TestHistoryJSONRoundTrip(t *testing.T) {
	b := &hb{}
	b.hold(1, "c1", "k", 10, 0, 5, 1005, 100)
	h := b.history()
	var buf bytes.Buffer
	if err := h.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	back, err := ReadHistory(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Events) != len(h.Events) || back.Seed != h.Seed || !reflect.DeepEqual(back.Events[1], h.Events[1]) {
		t.Fatalf("round trip changed the history: %+v", back)
	}
}

// sem is the checker's configuration for a semaphore run of limit n.
func sem(n int) Config {
	c := cfg
	c.Limit = n
	return c
}

// Up to Limit permits may be held at once; one more is a violation that
// names every hold involved. A mutex run judges the same history pair by
// pair under its own rule.
func TestCheckSemaphoreLimit(t *testing.T) {
	b := &hb{}
	b.hold(1, "c1", "k", 10, 0, 5, 1005, 600)
	b.hold(2, "c2", "k", 11, 10, 20, 1020, 700)  // two permits at once
	b.hold(3, "c3", "k", 12, 30, 600, 1600, 900) // enters as hold 1 stops
	b.hold(4, "c4", "k", 13, 40, 700, 1700, 950) // enters as hold 2 stops
	b.hold(5, "c5", "other", 3, 0, 5, 1005, 500) // another key's own permits
	r := Check(b.history(), sem(2))
	wantRules(t, r)
	if r.MaxHolds["k"] != 2 || r.MaxHolds["other"] != 1 {
		t.Errorf("MaxHolds = %v, want k:2 other:1", r.MaxHolds)
	}

	b.hold(6, "c6", "k", 14, 50, 650, 1650, 690) // a third holder while 3 and 2 hold
	r = Check(b.history(), sem(2))
	wantRules(t, r, RuleOverLimit)
	v := r.Violations[0]
	if v.A.ID != 2 || v.B.ID != 6 || len(v.Others) != 1 || v.Others[0].ID != 3 {
		t.Errorf("violation names A %d, B %d, others %v; want A 2, B 6, others [3]", v.A.ID, v.B.ID, v.Others)
	}
	for _, want := range []string{"B acquired a permit at 0.650s", "hold 2 until 0.700s, hold 3 until 0.900s", "3 holds at once, limit 2", "also: hold 3 (c3"} {
		if !strings.Contains(r.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, r)
		}
	}
	if r.MaxHolds["k"] != 3 {
		t.Errorf("MaxHolds[k] = %d, want 3", r.MaxHolds["k"])
	}
	// The limit 3 allows it.
	wantRules(t, Check(b.history(), sem(3)))
	// So does a limit for that key alone, and only for it.
	c := cfg
	c.Limits = map[string]int{"k": 3}
	wantRules(t, Check(b.history(), c))

	// A mutex run (Limit 0 or 1): the mutual exclusion rule, pair by pair,
	// under its old name.
	for _, n := range []int{0, 1} {
		wantRules(t, Check(b.history(), sem(n)), RuleOverlap, RuleOverlap, RuleOverlap, RuleOverlap, RuleOverlap)
	}
	b = &hb{}
	b.hold(1, "c1", "k", 10, 0, 5, 1005, 600)
	b.hold(2, "c2", "other", 3, 0, 5, 1005, 500)
	b.hold(3, "c3", "other", 4, 10, 20, 1020, 700)
	c.Limits = map[string]int{"k": 3}
	wantRules(t, Check(b.history(), c), RuleOverlap) // "other" is still a mutex
}

// A permit, like a lock, lasts until its holder's work stopped: a permit
// freed at the loss signal lets one holder too many in while the last step
// still runs. Once the work stopped (within the margin), the permit may go.
func TestCheckSemaphoreMargin(t *testing.T) {
	c := sem(2)
	c.StopSlack = ms(100)
	mk := func(thirdOK int) History {
		b := &hb{}
		b.lostWorking(1, "c1", "k", 10, 0, 5, 1005, 1040)
		b.hold(2, "c2", "k", 11, 10, 20, 2020, 1300)
		b.hold(3, "c3", "k", 12, 100, thirdOK, thirdOK+1000, thirdOK+100)
		return b.history()
	}
	r := Check(mk(1008), c) // the permit freed at hold 1's loss signal
	wantRules(t, r, RuleOverLimit)
	for _, want := range []string{"hold 1 until 1.040s, hold 2 until 1.300s", "3 holds at once, limit 2"} {
		if !strings.Contains(r.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, r)
		}
	}
	wantRules(t, Check(mk(1040), c)) // freed by the Release after the work stopped
	wantRules(t, Check(mk(1505), c)) // expired at its TTL

	// Without work-stopped events a hold ends at its signal.
	legacy := History{Seed: 42}
	for _, e := range mk(1008).Events {
		if e.Kind != WorkStopped {
			legacy.Events = append(legacy.Events, e)
		}
	}
	wantRules(t, Check(legacy, c))

	// Network faults widen nothing.
	b := &hb{}
	b.add(Event{At: ms(0), Kind: FaultStart, Fault: "cut"})
	b.hold(1, "c1", "k", 10, 0, 5, 1020, 0)
	b.hold(2, "c2", "k", 11, 0, 6, 1030, 0)
	b.hold(3, "c3", "k", 12, 10, 1020, 2020, 1100) // exactly as hold 1 stops: fine
	b.add(Event{At: ms(3000), Kind: FaultEnd, Fault: "cut"})
	wantRules(t, Check(b.history(), sem(2)))
	b.hold(4, "c4", "k", 13, 10, 1019, 2019, 1020) // 1ms before
	wantRules(t, Check(b.history(), sem(2)), RuleOverLimit)
}

// A state-loss fault lets the store give away permits whose holders cannot
// know yet: those holds do not count against the limit until the holders'
// renewals are refused (F.start + RenewDeadline + Slack). Holds granted
// after the fault count in full.
func TestCheckSemaphoreStateLoss(t *testing.T) {
	mk := func(aDeadline int, extra bool) History {
		b := &hb{}
		b.hold(1, "c1", "k", 10, 0, 5, aDeadline, 0)
		b.hold(2, "c2", "k", 11, 0, 8, 1008, 0)
		b.add(Event{At: ms(300), Kind: FaultStart, Fault: "delete", StateLoss: true})
		b.add(Event{At: ms(301), Kind: FaultEnd, Fault: "delete"})
		if extra {
			b.hold(5, "c5", "k", 12, 302, 305, 1305, 900)
		}
		b.hold(3, "c3", "k", 13, 310, 320, 1320, 900)
		b.hold(4, "c4", "k", 14, 310, 330, 1330, 900)
		return b.history()
	}
	// Four holds at once, two of them forgotten by the store.
	r := Check(mk(1200, false), sem(2))
	wantRules(t, r)
	if r.MaxHolds["k"] != 2 {
		t.Errorf("MaxHolds[k] = %d, want 2 (excused holds are not counted)", r.MaxHolds["k"])
	}
	// Hold 1 keeps acting past the fault start + RenewDeadline + Slack:
	// it counts from then on, against holds 3 and 4.
	r = Check(mk(1400, false), sem(2))
	wantRules(t, r, RuleOverLimit)
	if v := r.Violations[0]; v.A.ID != 1 || v.B.ID != 4 || !strings.Contains(v.Detail, "faults active: delete [0.300s, 0.301s]") {
		t.Errorf("violation: %+v\n%s", v, r)
	}
	// A hold granted after the fault is not excused: with it, holds 3 and 4
	// make three the store knew of.
	wantRules(t, Check(mk(1200, true), sem(2)), RuleOverLimit)
	wantRules(t, Check(mk(1200, true), sem(3)))
}

// Fencing tokens strictly increase per key across permits: concurrent
// permits have distinct tokens, and a permit acquired after another was
// granted has a larger one.
func TestCheckSemaphoreTokens(t *testing.T) {
	b := &hb{}
	b.hold(1, "c1", "k", 10, 0, 5, 1005, 500)
	b.hold(2, "c2", "k", 11, 10, 20, 1020, 500)
	b.hold(3, "c3", "k", 12, 100, 510, 1510, 600)
	wantRules(t, Check(b.history(), sem(2)))

	b = &hb{}
	b.hold(1, "c1", "k", 10, 0, 5, 1005, 500)
	b.hold(2, "c2", "k", 10, 10, 20, 1020, 500) // a second permit with the same token
	wantRules(t, Check(b.history(), sem(2)), RuleTokenReuse)

	b = &hb{}
	b.hold(1, "c1", "k", 10, 0, 5, 1005, 500)
	b.hold(2, "c2", "k", 9, 10, 20, 1020, 500) // asked after hold 1 was granted
	wantRules(t, Check(b.history(), sem(2)), RuleTokenOrder)

	// Permits acquired concurrently may get their tokens in either order.
	b = &hb{}
	b.hold(1, "c1", "k", 11, 0, 50, 1050, 500)
	b.hold(2, "c2", "k", 10, 10, 60, 1060, 500)
	wantRules(t, Check(b.history(), sem(2)))
}

// The unfenced counter and the fenced register assume mutual exclusion:
// on a semaphore key their rules are off, while acting outside a hold is
// still checked.
func TestCheckSemaphoreSkipsExclusiveResources(t *testing.T) {
	b := &hb{}
	b.hold(1, "c1", "k", 10, 0, 5, 1005, 500)
	b.hold(2, "c2", "k", 11, 10, 20, 1020, 500)
	b.add(Event{At: ms(100), Kind: CounterRead, Contender: "c1", Key: "k", Hold: 1, Value: 4})
	b.add(Event{At: ms(110), Kind: CounterRead, Contender: "c2", Key: "k", Hold: 2, Value: 4})
	b.add(Event{At: ms(120), Kind: CounterWrite, Contender: "c2", Key: "k", Hold: 2, Read: 4, Value: 5})
	b.add(Event{At: ms(130), Kind: CounterWrite, Contender: "c1", Key: "k", Hold: 1, Read: 4, Value: 5})
	b.add(Event{At: ms(140), Sent: ms(135), Kind: FencedWrite, Key: "k", Hold: 2, Token: 11, Accepted: true, Value: 1})
	b.add(Event{At: ms(150), Sent: ms(145), Kind: FencedWrite, Key: "k", Hold: 1, Token: 10, Accepted: true, Value: 2})
	wantRules(t, Check(b.history(), sem(2)))
	wantRules(t, Check(b.history(), cfg), RuleOverlap, RuleLostUpdate, RuleFenceOrder, RuleStaleFenced)

	b.add(Event{At: ms(600), Kind: CounterWrite, Contender: "c1", Key: "k", Hold: 1, Value: 6})
	wantRules(t, Check(b.history(), sem(2)), RuleActedOutside)
}

// A state-loss fault that was already under way when A started acquiring
// may still take A's claim after the store granted it: the excuse covers a
// fault active at any time between A's acquire-start and B's acquire-ok,
// and bounds A by the fault's end (or B's grant, if earlier) plus
// RenewDeadline and Slack. A fault over before A started excuses nothing.
func TestCheckStateLossUnderWay(t *testing.T) {
	mk := func(faultEnd, aDeadline int) History {
		b := &hb{}
		b.add(Event{At: ms(0), Kind: FaultStart, Fault: "delete", StateLoss: true})
		b.add(Event{At: ms(faultEnd), Kind: FaultEnd, Fault: "delete"})
		b.hold(1, "c1", "k", 10, 50, 80, aDeadline, 0)
		b.hold(2, "c2", "k", 11, 60, 110, 1110, 400)
		return b.history()
	}
	r := Check(mk(100, 1140), cfg) // within 100ms + 1s + 50ms
	wantRules(t, r)
	if len(r.Excused) != 1 || r.Excused[0].Rule != RuleOverlap {
		t.Errorf("want the overlap among the excused:\n%s", Report{Violations: r.Excused})
	}
	wantRules(t, Check(mk(100, 1160), cfg), RuleOverlap) // past the bound
	wantRules(t, Check(mk(40, 1080), cfg), RuleOverlap)  // over before A asked

	// With the deletion's record the excuse is exact: only a deletion that
	// removed A's claim and not B's, before B's grant in the store's order.
	exact := func(tokens []uint64, pos uint64) History {
		h := mk(100, 1140)
		h.Events = append(h.Events, Event{At: ms(95), Sent: ms(85), Kind: StateLost, Fault: "delete", Key: "k", Tokens: tokens, Pos: pos})
		return (&hb{h: h}).history()
	}
	wantRules(t, Check(exact([]uint64{10}, 0), cfg))
	wantRules(t, Check(exact([]uint64{10}, 10), cfg))
	wantRules(t, Check(exact(nil, 0), cfg), RuleOverlap)              // A's claim was not removed
	wantRules(t, Check(exact([]uint64{10, 11}, 0), cfg), RuleOverlap) // B's was too: granted before it
	wantRules(t, Check(exact([]uint64{10}, 11), cfg), RuleOverlap)    // B's grant came before it
}

// A restart without persistence loses every claim granted before the
// server stopped: recorded (StateLost with All), it excuses only the holds
// that asked before then and stopped within RenewDeadline + Slack of it, not
// one the restarted, empty store granted while the fault's window was
// still open.
func TestCheckRestartLosesEverything(t *testing.T) {
	mk := func(aStart, aOK, aDeadline int, record bool) History {
		b := &hb{}
		b.add(Event{At: ms(0), Kind: FaultStart, Fault: "restart", StateLoss: true})
		if record {
			b.add(Event{At: ms(10), Sent: ms(1), Kind: StateLost, Fault: "restart", All: true})
		}
		b.add(Event{At: ms(600), Kind: FaultEnd, Fault: "restart"})
		b.hold(1, "c1", "k", 10, aStart, aOK, aDeadline, 0)
		b.hold(2, "c2", "k", 11, 630, 700, 1700, 900)
		return b.history()
	}
	// Granted by the old server just before it stopped: excused either way.
	wantRules(t, Check(mk(2, 8, 1002, false), cfg))
	wantRules(t, Check(mk(2, 8, 1002, true), cfg))
	// Granted by the restarted server: the time rule alone lets it pass
	// (the window was open, 1.62s is within 1.05s of its end), the record
	// shows that B was granted while the new server had A's claim.
	wantRules(t, Check(mk(50, 610, 1610, false), cfg))
	wantRules(t, Check(mk(50, 610, 1610, true), cfg), RuleOverlap)
	// Asked before the stop but granted after it (its deadline is past the
	// stop + RenewDeadline + Slack): not excused.
	wantRules(t, Check(mk(2, 610, 1610, true), cfg), RuleOverlap)
}
