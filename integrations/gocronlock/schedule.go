package gocronlock

import (
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/dislock/dislock/core"
)

// Cron parses a crontab the way gocron.CronJob(crontab, withSeconds) does on
// a scheduler whose location is loc (nil means time.Local), and returns it as
// a core.Schedule for Locker.Schedule or Slot. A "TZ=" or "CRON_TZ=" prefix
// in crontab overrides loc.
func Cron(crontab string, withSeconds bool, loc *time.Location) (core.Schedule, error) {
	if loc == nil {
		loc = time.Local
	}
	spec := crontab
	if !strings.HasPrefix(spec, "TZ=") && !strings.HasPrefix(spec, "CRON_TZ=") {
		spec = fmt.Sprintf("CRON_TZ=%s %s", loc.String(), crontab)
	}
	var (
		sched cron.Schedule
		err   error
	)
	if withSeconds {
		p := cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
		sched, err = p.Parse(spec)
	} else {
		sched, err = cron.ParseStandard(spec)
	}
	if err != nil {
		return nil, invalid("Cron", "%q: %v", crontab, err)
	}
	if sched.Next(time.Now()).IsZero() {
		return nil, invalid("Cron", "%q never fires", crontab)
	}
	return sched, nil
}

// slotTolerance returns the tolerance for a start at now under sched: the
// configured one, or by default 1s or half the slot, whichever is shorter.
func (c *config) slotTolerance(sched core.Schedule, now time.Time) time.Duration {
	if c.toleranceSet {
		return c.tolerance
	}
	tol := core.DefaultSlotTolerance
	next := sched.Next(now)
	if next.IsZero() {
		return tol
	}
	after := sched.Next(next)
	if after.IsZero() {
		return tol
	}
	if half := after.Sub(next) / 2; half < tol {
		tol = half
	}
	return tol
}

// window shifts a schedule's slots tol earlier: the slot that ends at
// boundary b becomes the window [previous boundary - tol, b - tol). A start
// that fires up to tol before a boundary belongs to the coming slot, as
// with core.SlotTolerance, and the lock of the slot before it has already
// expired by then. With core.ForSlot(sched) and core.SlotTolerance(tol)
// instead, that lock lasts until the boundary itself and turns such an
// early start away: when every scheduler fires early, the tick is lost.
type window struct {
	sched core.Schedule
	tol   time.Duration
}

// Next implements core.Schedule. It is strictly after t because
// sched.Next(t + tol) is strictly after t + tol.
func (w window) Next(t time.Time) time.Time {
	next := w.sched.Next(t.Add(w.tol))
	if next.IsZero() {
		return next
	}
	return next.Add(-w.tol)
}
