package core

import (
	"fmt"
	"time"
)

// Schedule yields the start of the next schedule slot strictly after t.
// robfig/cron's schedules satisfy it, and so do gocron's job schedules once
// adapted. Next must be a pure function of t.
type Schedule interface {
	Next(t time.Time) time.Time
}

// ScheduleFunc adapts a function to Schedule.
type ScheduleFunc func(time.Time) time.Time

// Next calls f(t).
func (f ScheduleFunc) Next(t time.Time) time.Time { return f(t) }

// Every returns a Schedule whose slots are d long and aligned to the Unix
// epoch: with d = time.Minute, slots start at every whole minute on every
// machine. d must be positive: ForSlot(Every(d)) with d <= 0 fails with
// ErrInvalidOption ("period must be positive").
func Every(d time.Duration) Schedule { return every(d) }

type every time.Duration

func (e every) Next(t time.Time) time.Time {
	d := time.Duration(e)
	if d <= 0 {
		return time.Time{}
	}
	return t.Truncate(d).Add(d)
}

func (e every) String() string { return fmt.Sprintf("every %v", time.Duration(e)) }

// SlotEnd returns when the slot that a start at serverNow belongs to ends.
//
// Starts may fire up to tolerance early (clock skew between schedulers, or
// between a scheduler and the store). The slot of tick T therefore runs from
// T - tolerance to Next(T) - tolerance: a start that fires slightly before T
// belongs to T's slot, and so does one a little late, while the next tick's
// early starts find the slot already over. The result is
// sched.Next(serverNow + tolerance) - tolerance, which is always after
// serverNow.
func SlotEnd(sched Schedule, serverNow time.Time, tolerance time.Duration) time.Time {
	next := sched.Next(serverNow.Add(tolerance))
	if next.IsZero() {
		return next
	}
	return next.Add(-tolerance)
}
