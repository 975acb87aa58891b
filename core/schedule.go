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
// machine. d must be positive.
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

// SlotEnd returns the end of the slot that a start at serverNow belongs to:
// sched.Next(serverNow + tolerance). A start that fires up to tolerance early
// (clock skew between schedulers) therefore belongs to the coming slot.
func SlotEnd(sched Schedule, serverNow time.Time, tolerance time.Duration) time.Time {
	return sched.Next(serverNow.Add(tolerance))
}
