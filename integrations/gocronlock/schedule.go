package gocronlock

import (
	"errors"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/cronspec"
)

// Cron parses a crontab the way gocron.CronJob(crontab, withSeconds) does on
// a scheduler whose location is loc (nil means time.Local), and returns it as
// a core.Schedule for Locker.Schedule or Slot. A "TZ=" or "CRON_TZ=" prefix
// in crontab overrides loc. A value, range or step outside its field
// (*/61 in the minutes, which the parser would take as "minute 0") is
// rejected with an error naming the field.
func Cron(crontab string, withSeconds bool, loc *time.Location) (core.Schedule, error) {
	if err := cronspec.Check(crontab, withSeconds); err != nil {
		var fc *cronspec.FieldCountError
		if errors.As(err, &fc) {
			return nil, invalid("Cron", "%q: %v; for a seconds field pass withSeconds true, as with gocron.CronJob(crontab, true)", crontab, err)
		}
		return nil, invalid("Cron", "%q: %v", crontab, err)
	}
	if loc == nil {
		loc = time.Local
	}
	var (
		sched cron.Schedule
		err   error
	)
	if withSeconds {
		p := cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
		sched, err = p.Parse(crontab)
	} else {
		sched, err = cron.ParseStandard(crontab)
	}
	if err != nil {
		return nil, invalid("Cron", "%q: %v", crontab, err)
	}
	// loc itself, not its name: a location without a tz database name
	// (time.FixedZone) is one too.
	if spec, ok := sched.(*cron.SpecSchedule); ok && !hasTZ(crontab) {
		spec.Location = loc
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
