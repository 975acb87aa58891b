package chaos

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// Config gives the checker the timing the run used.
type Config struct {
	// RenewDeadline is the sessions' renew deadline. After a state-loss fault
	// (a lock removed behind its holder's back) the old holder may keep
	// acting until its next renewal is refused, and never past the moment
	// of the removal plus RenewDeadline plus Slack.
	RenewDeadline time.Duration
	// Slack is the round-trip and clock allowance added to that bound. It
	// never widens the window of any other fault, which is zero.
	Slack time.Duration
	// LossSlack is how long after a session's local deadline the engine may
	// take to signal the loss (timer and scheduling delay).
	LossSlack time.Duration
	// StopSlack is how long after its loss signal (or its local deadline,
	// whichever came first) a holder's work may take to stop; 0 checks
	// nothing. It must be shorter than TTL - RenewDeadline, the margin in
	// which the store keeps the key for the holder.
	StopSlack time.Duration
	// Limit is the number of permits of the run's keys: 0 or 1 for a mutex
	// (the rules as they always were), n > 1 for a semaphore (core.Limit(n)),
	// whose keys may have up to n holds at once. Limits overrides it per key.
	Limit int
	// Limits gives single keys a limit of their own (0 or absent: Limit).
	Limits map[string]int
}

// limit returns key's number of permits: 1 for a mutex.
func (c Config) limit(key string) int {
	if n := c.Limits[key]; n > 0 {
		return n
	}
	return max(c.Limit, 1)
}

// Hold is one session as the history shows it: it may act from OK until End,
// when its work stopped (the work-stopped event). For histories without that
// event, whose holders acted only while their sessions were valid, End is the
// earliest of the release start, the loss signal and the final local
// deadline.
type Hold struct {
	ID        int64         `json:"id"`
	Contender string        `json:"contender"`
	Key       string        `json:"key"`
	Token     uint64        `json:"token"`
	Start     time.Duration `json:"start"` // acquire-start
	OK        time.Duration `json:"ok"`    // acquire-ok
	Deadline  time.Duration `json:"deadline"`
	LostAt    time.Duration `json:"lost_at,omitempty"`
	ReleaseAt time.Duration `json:"release_at,omitempty"`
	StoppedAt time.Duration `json:"stopped_at,omitempty"`
	End       time.Duration `json:"end"`
	EndBy     string        `json:"end_by"` // "work stopped"; without it "release", "loss" or "deadline"
	Ended     bool          `json:"ended"`  // a hold-end event was recorded
	lost      bool
	released  bool
	stopped   bool
}

// signalled is when the holder had to stop: the earliest of its loss
// signal, its final local deadline and its release start.
func (h Hold) signalled() time.Duration {
	t := h.Deadline
	if h.lost && h.LostAt < t {
		t = h.LostAt
	}
	if h.released && h.ReleaseAt < t {
		t = h.ReleaseAt
	}
	return t
}

func (h Hold) String() string {
	s := fmt.Sprintf("hold %d (%s, key %q, token %d): acquire-start %.3fs, acquire-ok %.3fs, local deadline %.3fs",
		h.ID, h.Contender, h.Key, h.Token, h.Start.Seconds(), h.OK.Seconds(), h.Deadline.Seconds())
	if h.lost {
		s += fmt.Sprintf(", loss signalled %.3fs", h.LostAt.Seconds())
	}
	if h.stopped {
		s += fmt.Sprintf(", work stopped %.3fs", h.StoppedAt.Seconds())
	}
	if h.released {
		s += fmt.Sprintf(", release-start %.3fs", h.ReleaseAt.Seconds())
	}
	return s + fmt.Sprintf(" => held until %.3fs (%s)", h.End.Seconds(), h.EndBy)
}

// Violation is one broken rule with the evidence.
type Violation struct {
	Rule   string  `json:"rule"`
	Key    string  `json:"key,omitempty"`
	Detail string  `json:"detail"`
	A      *Hold   `json:"a,omitempty"`
	B      *Hold   `json:"b,omitempty"`
	Events []Event `json:"events,omitempty"`
	// Others are the further holds involved (RuleOverLimit: every hold of
	// the key, besides A and B, that was still held when B was granted).
	Others []Hold `json:"others,omitempty"`
}

// Rules the checker enforces (Violation.Rule).
const (
	RuleOverlap      = "overlapping holds"
	RuleOverLimit    = "more holds than the limit"
	RuleTokenOrder   = "fencing token went backwards"
	RuleTokenReuse   = "fencing token reused"
	RuleStaleFenced  = "stale fenced write accepted"
	RuleFenceOrder   = "fenced register order"
	RuleLostUpdate   = "lost update"
	RuleActedOutside = "acted outside its hold"
	RuleLossLate     = "loss signalled late"
	RuleLossMissing  = "loss never signalled"
	RuleSlowStop     = "work outlived its lease"
	RuleNoReacquire  = "cannot acquire after faults healed"
	RuleHeldAfterRun = "key held after the run"
	RuleUnfinished   = "contender did not finish"
)

// Report is the checker's verdict.
type Report struct {
	Seed       uint64      `json:"seed"`
	Holds      []Hold      `json:"holds"`
	Violations []Violation `json:"violations"`
	// Excused are the overlaps (and the lost updates within them) that a
	// state-loss fault allowed, each with the fault and the reason: not
	// violations, but what the faults cost.
	Excused []Violation `json:"excused,omitempty"`
	// MaxHolds is, per key, the most holds the store had granted at once
	// (holds a state-loss fault excuses not counted): a run whose semaphore
	// never had more than one holder tested little.
	MaxHolds map[string]int `json:"max_holds,omitempty"`
}

// OK reports whether no rule was broken.
func (r Report) OK() bool { return len(r.Violations) == 0 }

// String prints the seed and every violation with its offending holds.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: %d holds, %d violations\n", r.Seed, len(r.Holds), len(r.Violations))
	for i, v := range r.Violations {
		fmt.Fprintf(&b, "%d. %s", i+1, v.Rule)
		if v.Key != "" {
			fmt.Fprintf(&b, " on key %q", v.Key)
		}
		fmt.Fprintf(&b, ": %s\n", v.Detail)
		if v.A != nil {
			fmt.Fprintf(&b, "   A: %s\n", v.A)
		}
		if v.B != nil {
			fmt.Fprintf(&b, "   B: %s\n", v.B)
		}
		for _, o := range v.Others {
			fmt.Fprintf(&b, "   also: %s\n", o)
		}
		for _, e := range v.Events {
			fmt.Fprintf(&b, "   | %s\n", e)
		}
	}
	return b.String()
}

type fault struct {
	name       string
	start, end time.Duration
	stateLoss  bool
	// lost holds the fault's StateLost events by key: for those keys the
	// fault excuses exactly the holds whose claims they removed.
	lost map[string][]Event
}

// Check is a pure function over a history. The rules, per key:
//
//   - Mutual exclusion (a mutex: Limit 0 or 1). Hold A lasts from its
//     acquire-ok until End, when its work stopped. A loss does not end the work at once: the holder learns
//     of it at its local deadline (the send time of its last successful
//     acquire or renewal plus the renew deadline, shorter than the TTL) and
//     then needs a moment to stop. The store keeps the key until the holder
//     releases it or its lease expires there, at least TTL after that send
//     time, so for two holds with A.OK <= B.OK the rule is A.End <= B.OK, with
//     no slack at all: the TTL minus the renew deadline is the margin, and
//     faults on the network (cut, dropped replies, latency, reset, killed
//     server connections, a paused store) do not widen it. An engine that
//     frees the key at the loss signal, while the work is still stopping,
//     breaks it. Only a state-loss fault F (lock deleted, store restarted
//     without persistence) lets B in while A cannot know: such an overlap is
//     allowed when F was under way at some time between A's acquire-start
//     and B's acquire-ok, and A had to stop (loss, deadline or release)
//     within RenewDeadline + Slack of the removal (A's renewals after it are
//     refused, so its deadline cannot move past that). Where F's StateLost
//     events say what it removed from the key, that is exact: a deletion
//     that removed A's claim and not B's, before B's grant in the store's
//     order, answered no earlier than RenewDeadline + Slack before A had to
//     stop. Otherwise the removal is placed at the end of F or at B's
//     acquire-ok, whichever came first. Allowed overlaps go to
//     Report.Excused. Histories without work-stopped events end a hold at the
//     earliest of its release start, loss signal and final local deadline.
//     This is RuleOverlap, for keys whose limit (Config.Limit, Limits) is 0
//     or 1.
//   - At most Limit holds at once, for a semaphore (limit n > 1,
//     RuleOverLimit): the same rule counted instead of paired. When hold B is
//     granted (its acquire-ok), at most n - 1 holds of the key that were
//     granted no later than B may still be held (End > B.OK), with the same
//     exceptions and no others: a hold A that a state-loss fault excuses
//     against B as above (the store forgot A's permit, so it could give it
//     again while A could not know) is not counted. With n = 1 this is the
//     mutual exclusion rule.
//   - The work stops within StopSlack of the moment the holder had to stop
//     (its loss signal or local deadline, whichever came first).
//   - Fencing tokens strictly increase per key, across all of a semaphore's
//     permits as well: when A.OK < B.Start, A.Token < B.Token, and no two
//     holds share a token.
//   - The fenced register never accepts a stale token: accepted writes in the
//     register's own order carry non-decreasing tokens, and no write is
//     accepted after (by reply time) a write with a greater token was.
//     It assumes mutual exclusion and is not checked on semaphore keys
//     (limit > 1), whose permits hold the key together: there a smaller
//     token is rejected while the permit holding it is still valid.
//   - No lost update in the unfenced counter: between a hold's read and its
//     write of the counter no other hold writes it, unless the two holds'
//     overlap is one the first rule allows. It too assumes mutual exclusion
//     and is not checked on semaphore keys, whose holders may all update the
//     counter at once.
//   - A holder acts only inside its hold: counter writes happen before End.
//   - A loss is signalled no later than LossSlack after the final local
//     deadline (or after acquire-ok, for a session whose acquisition outlasted
//     its renew deadline), and a holder that saw its deadline pass saw the signal.
//   - After the Healed event every contender acquires again, no key is held
//     after the run, and every hold and contender finished.
func Check(h History, cfg Config) Report {
	rep := Report{Seed: h.Seed}
	holds := map[int64]*Hold{}
	var order []int64
	starts := map[string]time.Duration{} // contender+key -> last acquire-start
	var faults []fault
	open := map[string]int{}
	var healedAt time.Duration
	healed := false
	contenders := map[string]bool{}
	okAfterHeal := map[string]bool{}
	var pauses []Event // Paused: the process did not run from Sent to At
	get := func(e Event) *Hold {
		return holds[e.Hold]
	}
	for _, e := range h.Events {
		if e.Contender != "" && e.Kind != Stuck {
			contenders[e.Contender] = true
		}
		switch e.Kind {
		case AcquireStart:
			starts[e.Contender+"\x00"+e.Key] = e.At
		case AcquireOK:
			hd := &Hold{ID: e.Hold, Contender: e.Contender, Key: e.Key, Token: e.Token,
				Start: e.At, OK: e.At, Deadline: e.Deadline}
			if s, ok := starts[e.Contender+"\x00"+e.Key]; ok {
				hd.Start = s
			}
			holds[e.Hold] = hd
			order = append(order, e.Hold)
			if healed && e.At >= healedAt {
				okAfterHeal[e.Contender] = true
			}
		case Lost:
			if hd := get(e); hd != nil && !hd.lost {
				hd.lost, hd.LostAt = true, e.At
			}
		case WorkStopped:
			if hd := get(e); hd != nil && !hd.stopped {
				hd.stopped, hd.StoppedAt = true, e.At
			}
		case ReleaseStart:
			if hd := get(e); hd != nil && !hd.released {
				hd.released, hd.ReleaseAt = true, e.At
			}
		case HoldEnd:
			if hd := get(e); hd != nil {
				hd.Ended = true
				if e.Deadline != 0 {
					hd.Deadline = e.Deadline
				}
			}
		case LossMissing:
			v := Violation{Rule: RuleLossMissing, Key: e.Key, Events: []Event{e},
				Detail: "the local deadline passed and the session still reported no loss"}
			if hd := get(e); hd != nil {
				c := *hd
				v.A = &c
			}
			rep.Violations = append(rep.Violations, v)
		case FaultStart:
			open[e.Fault] = len(faults)
			faults = append(faults, fault{name: e.Fault, start: e.At, end: -1, stateLoss: e.StateLoss})
		case StateLost:
			i, ok := open[e.Fault]
			if !ok { // recorded after its fault's end: the latest fault of that name
				i = -1
				for j, f := range faults {
					if f.name == e.Fault && f.start <= e.At {
						i = j
					}
				}
			}
			if i >= 0 {
				f := &faults[i]
				if f.lost == nil {
					f.lost = map[string][]Event{}
				}
				k := e.Key
				if e.All {
					k = "" // every key
				}
				f.lost[k] = append(f.lost[k], e)
			}
		case FaultEnd:
			if i, ok := open[e.Fault]; ok {
				faults[i].end = e.At
				delete(open, e.Fault)
			}
		case Paused:
			pauses = append(pauses, e)
		case Healed:
			healed, healedAt = true, e.At
		case HeldAfterRun:
			rep.Violations = append(rep.Violations, Violation{Rule: RuleHeldAfterRun, Key: e.Key, Events: []Event{e},
				Detail: "the key was still held after every Locker closed and its TTL passed"})
		case Stuck:
			rep.Violations = append(rep.Violations, Violation{Rule: RuleUnfinished, Key: e.Key, Events: []Event{e},
				Detail: fmt.Sprintf("%s did not stop in time", e.Contender)})
		}
	}

	byKey := map[string][]*Hold{}
	for _, id := range order {
		hd := holds[id]
		switch {
		case hd.stopped:
			hd.End, hd.EndBy = hd.StoppedAt, "work stopped"
		default:
			hd.End, hd.EndBy = hd.Deadline, "deadline"
			if hd.lost && hd.LostAt < hd.End {
				hd.End, hd.EndBy = hd.LostAt, "loss"
			}
			if hd.released && hd.ReleaseAt < hd.End {
				hd.End, hd.EndBy = hd.ReleaseAt, "release"
			}
		}
		byKey[hd.Key] = append(byKey[hd.Key], hd)
		rep.Holds = append(rep.Holds, *hd)
		if !hd.Ended {
			c := *hd
			rep.Violations = append(rep.Violations, Violation{Rule: RuleUnfinished, Key: hd.Key, A: &c,
				Detail: "the hold has no hold-end: its contender never finished with it"})
		}
		if sig := hd.signalled(); cfg.StopSlack > 0 && hd.stopped && hd.StoppedAt > sig+cfg.StopSlack+paused(pauses, sig, hd.StoppedAt) {
			c := *hd
			rep.Violations = append(rep.Violations, Violation{Rule: RuleSlowStop, Key: hd.Key, A: &c,
				Detail: fmt.Sprintf("the work stopped %v after the holder had to stop (allowed %v%s)",
					(hd.StoppedAt - sig).Round(time.Millisecond), cfg.StopSlack, pausedNote(pauses, sig, hd.StoppedAt))})
		}
		// A session whose acquisition took longer than the renew deadline
		// is born expired; its loss is due at once.
		due := max(hd.Deadline, hd.OK)
		if hd.lost && hd.LostAt > due+cfg.LossSlack+paused(pauses, due, hd.LostAt) {
			c := *hd
			rep.Violations = append(rep.Violations, Violation{Rule: RuleLossLate, Key: hd.Key, A: &c,
				Detail: fmt.Sprintf("loss signalled %v after it was due (allowed %v%s)",
					(hd.LostAt - due).Round(time.Millisecond), cfg.LossSlack, pausedNote(pauses, due, hd.LostAt))})
		}
	}

	// excused reports whether the overlap of a (earlier acquire-ok) and b is
	// one a state-loss fault F allows, and why. F must have been under way at
	// some time between A's acquire-start and B's acquire-ok: a deletion may
	// take A's claim right after the store granted it, while A's answer is
	// still on its way. Where the history records what F removed (StateLost
	// events for the key, or for every key), the excuse is exact:
	//   - a deletion removed A's claim and not B's, B's grant came after it
	//     (B's token is above the deletion's store position, where the store
	//     has one, and B's acquire-ok is after the deletion was sent), and A
	//     had to stop within RenewDeadline + Slack of the deletion's answer;
	//   - or the store lost everything (All: killed between Sent and At),
	//     with At no earlier than A's acquire-start and Sent no later than
	//     B's acquire-ok, and A had to stop within RenewDeadline + Slack of
	//     At.
	// Otherwise the time rule: A had to stop within RenewDeadline + Slack of
	// the end of F or of B's acquire-ok, whichever came first (by then the
	// removal had happened, and A's renewals after it are refused). How long
	// A's work then took to stop is the StopSlack rule's business.
	excused := func(a, b *Hold) (bool, string) {
		bound := cfg.RenewDeadline + cfg.Slack
		for _, f := range faults {
			if !f.stateLoss || f.start > b.OK || (f.end >= 0 && f.end < a.Start) {
				continue
			}
			if ls := slices.Concat(f.lost[a.Key], f.lost[""]); len(ls) > 0 {
				for _, l := range ls {
					if l.All && a.Start <= l.At && l.Sent <= b.OK && a.signalled() <= l.At+bound {
						return true, fmt.Sprintf("%s lost every claim granted before %.3fs (the store stopped between %.3fs and then), A's among them, and B's grant came after",
							f.name, l.At.Seconds(), l.Sent.Seconds())
					}
					if !l.All && a.Token != 0 && slices.Contains(l.Tokens, a.Token) && !slices.Contains(l.Tokens, b.Token) &&
						(l.Pos == 0 || b.Token > l.Pos) && l.Sent <= b.OK && a.signalled() <= l.At+bound {
						return true, fmt.Sprintf("%s removed A's claim (token %d) in a deletion sent at %.3fs and answered at %.3fs%s, before B's grant",
							f.name, a.Token, l.Sent.Seconds(), l.At.Seconds(), posText(l.Pos))
					}
				}
				continue
			}
			end := b.OK
			if f.end >= 0 && f.end < end {
				end = f.end
			}
			if a.signalled() <= end+bound {
				return true, fmt.Sprintf("%s [%.3fs, %.3fs] was under way between A's acquire-start and B's acquire-ok, and A had to stop by %.3fs (within %v of %.3fs)",
					f.name, f.start.Seconds(), f.end.Seconds(), a.signalled().Seconds(), bound, end.Seconds())
			}
		}
		return false, ""
	}
	faultsBetween := func(from, to time.Duration) string {
		var names []string
		for _, f := range faults {
			if f.start <= to && (f.end < 0 || f.end >= from) {
				names = append(names, fmt.Sprintf("%s [%.3fs, %.3fs]", f.name, f.start.Seconds(), f.end.Seconds()))
			}
		}
		if len(names) == 0 {
			return "none"
		}
		return strings.Join(names, ", ")
	}

	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	rep.MaxHolds = map[string]int{}
	for _, k := range keys {
		list := byKey[k]
		n := cfg.limit(k)
		sort.SliceStable(list, func(i, j int) bool { return list[i].OK < list[j].OK })
		for i, a := range list {
			for _, b := range list[i+1:] {
				if n == 1 && a.End > b.OK && b.End > b.OK {
					ca, cb := *a, *b
					v := Violation{Rule: RuleOverlap, Key: k, A: &ca, B: &cb}
					overlap := fmt.Sprintf("A held the key until %.3fs but B acquired it at %.3fs: %v of overlap",
						a.End.Seconds(), b.OK.Seconds(), (a.End - b.OK).Round(time.Microsecond))
					if ok, why := excused(a, b); ok {
						v.Detail = overlap + ", allowed: " + why
						rep.Excused = append(rep.Excused, v)
					} else {
						v.Detail = fmt.Sprintf("%s, none allowed (faults active: %s)", overlap, faultsBetween(a.Start, b.OK))
						rep.Violations = append(rep.Violations, v)
					}
				}
				if a.Token != 0 && a.Token == b.Token {
					ca, cb := *a, *b
					rep.Violations = append(rep.Violations, Violation{Rule: RuleTokenReuse, Key: k, A: &ca, B: &cb,
						Detail: fmt.Sprintf("two sessions got token %d", a.Token)})
				} else if a.OK < b.Start && a.Token != 0 && b.Token != 0 && b.Token < a.Token {
					ca, cb := *a, *b
					rep.Violations = append(rep.Violations, Violation{Rule: RuleTokenOrder, Key: k, A: &ca, B: &cb,
						Detail: fmt.Sprintf("B started acquiring after A had token %d and got the smaller token %d (faults: %s)",
							a.Token, b.Token, faultsBetween(a.OK, b.OK))})
				}
			}
		}
		// Holds at once: at each grant B, the earlier holds still held that
		// no state-loss fault excuses. For a mutex (n == 1) the pairs above
		// are the rule; a semaphore allows n.
		for j, b := range list {
			if b.End <= b.OK {
				continue
			}
			var live []*Hold
			for _, a := range list[:j] {
				if a.End > b.OK {
					if ok, _ := excused(a, b); !ok {
						live = append(live, a)
					}
				}
			}
			rep.MaxHolds[k] = max(rep.MaxHolds[k], len(live)+1)
			if n == 1 || len(live) < n {
				continue
			}
			ca, cb := *live[0], *b
			v := Violation{Rule: RuleOverLimit, Key: k, A: &ca, B: &cb}
			var until []string
			for _, a := range live {
				until = append(until, fmt.Sprintf("hold %d until %.3fs", a.ID, a.End.Seconds()))
				if a != live[0] {
					v.Others = append(v.Others, *a)
				}
			}
			v.Detail = fmt.Sprintf("B acquired a permit at %.3fs while %d other holds still held the key (%s): %d holds at once, limit %d (faults active: %s)",
				b.OK.Seconds(), len(live), strings.Join(until, ", "), len(live)+1, n, faultsBetween(live[0].OK, b.OK))
			rep.Violations = append(rep.Violations, v)
		}
	}

	// Counter and fenced register.
	lastRead := map[int64]Event{}
	type update struct{ read, write Event } // a write and the hold's read before it
	var updates []update
	writes := map[string][]Event{}
	fenced := map[string][]Event{}
	for _, e := range h.Events {
		switch e.Kind {
		case CounterRead:
			lastRead[e.Hold] = e
		case CounterWrite:
			if r, ok := lastRead[e.Hold]; ok {
				updates = append(updates, update{r, e})
			}
			writes[e.Key] = append(writes[e.Key], e)
			if hd := holds[e.Hold]; hd != nil && e.At > hd.End {
				c := *hd
				rep.Violations = append(rep.Violations, Violation{Rule: RuleActedOutside, Key: e.Key, A: &c, Events: []Event{e},
					Detail: fmt.Sprintf("counter written at %.3fs, %v after the hold ended", e.At.Seconds(), (e.At - hd.End).Round(time.Microsecond))})
			}
		case FencedWrite:
			fenced[e.Key] = append(fenced[e.Key], e)
		}
	}
	for _, u := range updates {
		r, e := u.read, u.write
		if cfg.limit(e.Key) > 1 {
			continue // permits share the key: the counter is not theirs alone
		}
		ws := writes[e.Key] // in time order
		from := sort.Search(len(ws), func(i int) bool { return ws[i].At > r.At })
		for _, o := range ws[from:] {
			if o.At >= e.At {
				break
			}
			if o.Hold == e.Hold {
				continue
			}
			a, b := holds[o.Hold], holds[e.Hold]
			why := ""
			if a != nil && b != nil {
				first, second := a, b
				if second.OK < first.OK {
					first, second = second, first
				}
				_, why = excused(first, second)
			}
			v := Violation{Rule: RuleLostUpdate, Key: e.Key, Events: []Event{r, o, e},
				Detail: fmt.Sprintf("hold %d read %d, hold %d wrote %d, then hold %d wrote %d: one increment is lost",
					e.Hold, r.Value, o.Hold, o.Value, e.Hold, e.Value)}
			if b != nil {
				c := *b
				v.A = &c
			}
			if a != nil {
				c := *a
				v.B = &c
			}
			if why != "" {
				v.Detail += ", allowed: " + why
				rep.Excused = append(rep.Excused, v)
				continue
			}
			rep.Violations = append(rep.Violations, v)
		}
	}
	fkeys := make([]string, 0, len(fenced))
	for k := range fenced {
		if cfg.limit(k) == 1 {
			fkeys = append(fkeys, k)
		}
	}
	sort.Strings(fkeys)
	for _, k := range fkeys {
		var acc []Event
		for _, e := range fenced[k] {
			if e.Accepted {
				acc = append(acc, e)
			}
		}
		sort.SliceStable(acc, func(i, j int) bool { return acc[i].Value < acc[j].Value })
		for i := 1; i < len(acc); i++ {
			if acc[i].Token < acc[i-1].Token {
				rep.Violations = append(rep.Violations, Violation{Rule: RuleFenceOrder, Key: k, Events: []Event{acc[i-1], acc[i]},
					Detail: fmt.Sprintf("the register accepted token %d after token %d", acc[i].Token, acc[i-1].Token)})
			}
		}
		for _, w := range acc {
			for _, o := range acc {
				if o.Token > w.Token && o.At < w.Sent {
					rep.Violations = append(rep.Violations, Violation{Rule: RuleStaleFenced, Key: k, Events: []Event{o, w},
						Detail: fmt.Sprintf("token %d was accepted although token %d had been accepted before it was sent", w.Token, o.Token)})
					break
				}
			}
		}
	}

	if healed {
		names := make([]string, 0, len(contenders))
		for c := range contenders {
			names = append(names, c)
		}
		sort.Strings(names)
		for _, c := range names {
			if !okAfterHeal[c] {
				rep.Violations = append(rep.Violations, Violation{Rule: RuleNoReacquire,
					Detail: fmt.Sprintf("%s acquired nothing after the faults healed at %.3fs", c, healedAt.Seconds())})
			}
		}
	}
	return rep
}

func posText(pos uint64) string {
	if pos == 0 {
		return ""
	}
	return fmt.Sprintf(" at store position %d", pos)
}

// paused returns how long, between from and to, the test process did not
// run (Paused events): time in which neither the engine nor the work could
// act, which the lateness rules do not count.
func paused(pauses []Event, from, to time.Duration) time.Duration {
	var d time.Duration
	for _, p := range pauses {
		if lo, hi := max(p.Sent, from), min(p.At, to); hi > lo {
			d += hi - lo
		}
	}
	return d
}

// pausedNote says how much of from..to the process was paused, if any.
func pausedNote(pauses []Event, from, to time.Duration) string {
	if d := paused(pauses, from, to); d > 0 {
		return fmt.Sprintf(", plus %v in which the test process was paused", d.Round(time.Millisecond))
	}
	return ""
}
