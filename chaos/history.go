package chaos

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"
)

// Kind names what an Event records.
type Kind string

// Event kinds. Times are offsets from the run's common start on the local
// monotonic clock.
const (
	// AcquireStart: a contender is about to ask for Key.
	AcquireStart Kind = "acquire-start"
	// AcquireOK: the acquisition returned a session (Hold, Token, Deadline).
	AcquireOK Kind = "acquire-ok"
	// AcquireBusy: the acquisition ended without the lock, for certain.
	AcquireBusy Kind = "acquire-busy"
	// AcquireUnknown: the acquisition failed on a backend error; the store may
	// have applied it (the engine undoes it by owner token).
	AcquireUnknown Kind = "acquire-unknown"
	// Lost: the engine signalled the loss of Hold's lease.
	Lost Kind = "lost"
	// WorkStopped: the holder's work on Hold has stopped, recorded before
	// Release is called. The hold lasts from acquire-ok until here: after a
	// loss the work stops within a bounded time, not at the signal.
	WorkStopped Kind = "work-stopped"
	// ReleaseStart: the holder starts releasing Hold.
	ReleaseStart Kind = "release-start"
	// ReleaseEnd: the release returned (Err when it failed).
	ReleaseEnd Kind = "release-end"
	// HoldEnd: the contender is done with Hold; Deadline is the session's
	// final local deadline.
	HoldEnd Kind = "hold-end"
	// LossMissing: the holder saw its local deadline pass but no loss was
	// signalled within the allowed slack.
	LossMissing Kind = "loss-missing"
	// CounterRead / CounterWrite: the unfenced read-sleep-write counter of
	// Key; a write carries the value read (Read) and the value written.
	CounterRead  Kind = "counter-read"
	CounterWrite Kind = "counter-write"
	// FencedWrite: a write to the fenced register with Token; Accepted says
	// whether the register took it, Value is the register's write sequence
	// number when it did. Sent is when the write was sent.
	FencedWrite Kind = "fenced-write"
	// FaultStart / FaultEnd bracket a fault. StateLoss marks faults that can
	// remove a lock behind its holder's back (deleted key or row, restarted
	// store), after which the holder learns of the loss only at its next
	// renewal.
	FaultStart Kind = "fault-start"
	FaultEnd   Kind = "fault-end"
	// StateLost: during the state-loss fault Fault, one deletion of Key's
	// lock records, sent at Sent and answered at At. Tokens are the fencing
	// tokens of every claim it removed, as the store reported them (etcd:
	// the deleted keys' create revisions; ZooKeeper: the deleted nodes'
	// czxids; PostgreSQL: the deleted rows' tokens). Pos, when not 0, is the
	// deletion's place in the store's own order in the tokens' units, for a
	// store whose every grant after the deletion gets a token above it
	// (etcd: the delete's revision). A fault with such events for a key
	// excuses exactly the holds whose claims they removed; without them the
	// checker falls back to the fault's time window. All (no Key, no
	// Tokens) records a store that lost every claim granted before At (a
	// restart without persistence: the server killed between Sent and At).
	StateLost Kind = "state-lost"
	// Healed: all faults are over and the store answers again.
	Healed Kind = "healed"
	// HeldAfterRun: Key was still held after every Locker closed and the
	// TTL passed.
	HeldAfterRun Kind = "held-after-run"
	// Stuck: a contender did not finish in time.
	Stuck Kind = "stuck"
	// Paused: the test process did not run from Sent to At: a goroutine
	// that sleeps pauseTick at a time woke that much late (WatchPauses).
	// Nothing in the process, the lock engine's timers included, could act
	// meanwhile, so the rules that bound how late the engine and the work
	// may act (Config.LossSlack, Config.StopSlack) do not count that time.
	Paused Kind = "paused"
)

// pauseTick is how long the goroutine of WatchPauses sleeps at a time;
// pauseMin is how late it must wake for a Paused event.
const (
	pauseTick = 10 * time.Millisecond
	pauseMin  = 100 * time.Millisecond
)

// WatchPauses records a Paused event whenever a goroutine that sleeps
// pauseTick at a time wakes more than pauseMin late (a machine too busy to
// run the process, a stop of the whole process), until stop is closed; the
// returned channel is closed when that goroutine has ended.
func (r *Recorder) WatchPauses(stop <-chan struct{}) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTimer(pauseTick)
		defer t.Stop()
		due := time.Now().Add(pauseTick)
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			now := time.Now()
			if now.Sub(due) > pauseMin {
				r.Add(Event{Kind: Paused, Sent: r.Since(due), At: r.Since(now)})
			}
			due = now.Add(pauseTick)
			t.Reset(pauseTick)
		}
	}()
	return done
}

// Event is one entry of a History.
type Event struct {
	At        time.Duration `json:"at"`
	Kind      Kind          `json:"kind"`
	Contender string        `json:"contender,omitempty"`
	Key       string        `json:"key,omitempty"`
	Hold      int64         `json:"hold,omitempty"`
	Token     uint64        `json:"token,omitempty"`
	Deadline  time.Duration `json:"deadline,omitempty"`
	Value     int64         `json:"value,omitempty"`
	Read      int64         `json:"read,omitempty"`
	Sent      time.Duration `json:"sent,omitempty"`
	Accepted  bool          `json:"accepted,omitempty"`
	Fault     string        `json:"fault,omitempty"`
	StateLoss bool          `json:"state_loss,omitempty"`
	Tokens    []uint64      `json:"tokens,omitempty"`
	Pos       uint64        `json:"pos,omitempty"`
	All       bool          `json:"all,omitempty"`
	Err       string        `json:"err,omitempty"`
}

func (e Event) String() string {
	s := fmt.Sprintf("%9.3fs %-14s", e.At.Seconds(), e.Kind)
	if e.Contender != "" {
		s += " " + e.Contender
	}
	if e.Key != "" {
		s += " key=" + e.Key
	}
	if e.Hold != 0 {
		s += fmt.Sprintf(" hold=%d", e.Hold)
	}
	if e.Token != 0 {
		s += fmt.Sprintf(" token=%d", e.Token)
	}
	if e.Deadline != 0 {
		s += fmt.Sprintf(" deadline=%.3fs", e.Deadline.Seconds())
	}
	switch e.Kind {
	case CounterRead:
		s += fmt.Sprintf(" value=%d", e.Value)
	case CounterWrite:
		s += fmt.Sprintf(" read=%d wrote=%d", e.Read, e.Value)
	case FencedWrite:
		s += fmt.Sprintf(" sent=%.3fs accepted=%v seq=%d", e.Sent.Seconds(), e.Accepted, e.Value)
	}
	if e.Kind == StateLost {
		removed := fmt.Sprint(e.Tokens)
		if e.All {
			removed = "everything"
		}
		s += fmt.Sprintf(" sent=%.3fs removed=%s", e.Sent.Seconds(), removed)
		if e.Pos != 0 {
			s += fmt.Sprintf(" pos=%d", e.Pos)
		}
	}
	if e.Fault != "" {
		s += " fault=" + e.Fault
		if e.StateLoss {
			s += " (state loss)"
		}
	}
	if e.Err != "" {
		s += " err=" + e.Err
	}
	return s
}

// History is a run's events in the order they were recorded.
type History struct {
	Seed   uint64  `json:"seed"`
	Events []Event `json:"events"`
}

// Recorder collects a History; it is safe for concurrent use. Every
// timestamp is time.Since(start) of one common start, so all of a run's
// events share one monotonic clock.
type Recorder struct {
	start time.Time
	mu    sync.Mutex
	h     History
	hold  int64
}

// NewRecorder returns a Recorder whose clock starts now.
func NewRecorder(seed uint64) *Recorder {
	return &Recorder{start: time.Now(), h: History{Seed: seed}}
}

// Since returns t as an offset from the recorder's start.
func (r *Recorder) Since(t time.Time) time.Duration { return t.Sub(r.start) }

// Now returns the current offset from the recorder's start.
func (r *Recorder) Now() time.Duration { return time.Since(r.start) }

// NewHold returns a fresh hold id.
func (r *Recorder) NewHold() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hold++
	return r.hold
}

// Add records e, stamping it with the current time when e.At is zero.
func (r *Recorder) Add(e Event) {
	if e.At == 0 {
		e.At = r.Now()
	}
	r.mu.Lock()
	r.h.Events = append(r.h.Events, e)
	r.mu.Unlock()
}

// History returns a copy of the events so far, sorted by time.
func (r *Recorder) History() History {
	r.mu.Lock()
	h := History{Seed: r.h.Seed, Events: append([]Event(nil), r.h.Events...)}
	r.mu.Unlock()
	sort.SliceStable(h.Events, func(i, j int) bool { return h.Events[i].At < h.Events[j].At })
	return h
}

// WriteJSON writes h as indented JSON.
func (h History) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	return enc.Encode(h)
}

// Dump writes h as JSON into dir (the system's temporary directory when
// dir is empty) and returns the file's path.
func (h History) Dump(dir, name string) (string, error) {
	if dir == "" {
		dir = os.TempDir()
	}
	f, err := os.CreateTemp(dir, fmt.Sprintf("chaos-%s-seed%d-*.json", name, h.Seed))
	if err != nil {
		return "", err
	}
	defer f.Close()
	if err := h.WriteJSON(f); err != nil {
		return "", err
	}
	return filepath.Clean(f.Name()), f.Close()
}

// ReadHistory decodes a History written by WriteJSON.
func ReadHistory(r io.Reader) (History, error) {
	var h History
	err := json.NewDecoder(r).Decode(&h)
	return h, err
}
