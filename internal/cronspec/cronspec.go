// Package cronspec checks the numbers of a cron spec against their fields
// before robfig/cron parses it. That parser accepts a step larger than its
// field (*/61 in the minute field becomes "minute 0", hourly) without a
// word; Check rejects it, and every value or range outside its field, with
// an error naming the field.
package cronspec

import (
	"fmt"
	"strconv"
	"strings"
)

// field is one position of a spec and the values it allows.
type field struct {
	name     string
	min, max int
}

var (
	second = field{"second", 0, 59}
	five   = []field{{"minute", 0, 59}, {"hour", 0, 23}, {"day of month", 1, 31}, {"month", 1, 12}, {"day of week", 0, 6}}
)

// Check checks spec, a crontab line with withSeconds saying whether it
// starts with a seconds field. Descriptors (@hourly, @every 5m) and a TZ= or
// CRON_TZ= prefix are passed over; a spec with the wrong number of fields is
// left to the parser, except that a 6-field spec without withSeconds gets
// an error of its own (FieldCountError) so that callers can say how to get
// seconds.
func Check(spec string, withSeconds bool) error {
	s := strings.TrimSpace(spec)
	if strings.HasPrefix(s, "TZ=") || strings.HasPrefix(s, "CRON_TZ=") {
		i := strings.IndexAny(s, " \t")
		if i < 0 {
			return nil
		}
		s = strings.TrimSpace(s[i:])
	}
	if strings.HasPrefix(s, "@") {
		return nil
	}
	parts := strings.Fields(s)
	fields := five
	if withSeconds {
		fields = append([]field{second}, five...)
		if len(parts) == 5 {
			fields = five // seconds are optional there, as in gocron
		}
	}
	if len(parts) != len(fields) {
		if !withSeconds && len(parts) == 6 {
			return &FieldCountError{Got: 6}
		}
		return nil
	}
	for i, p := range parts {
		if err := checkField(fields[i], p); err != nil {
			return err
		}
	}
	return nil
}

// FieldCountError is the error of a 6-field spec where 5 fields are expected.
type FieldCountError struct{ Got int }

func (e *FieldCountError) Error() string {
	return fmt.Sprintf("%d fields, expected 5 (minute hour day-of-month month day-of-week)", e.Got)
}

// checkField checks each comma-separated part of a field: a value, a range
// a-b, *, ?, each optionally with /step.
func checkField(f field, text string) error {
	for _, part := range strings.Split(text, ",") {
		rng, stepText, hasStep := strings.Cut(part, "/")
		lo := f.min
		switch rng {
		case "*", "?":
		default:
			a, b, isRange := strings.Cut(rng, "-")
			va, okA := number(a)
			vb, okB := va, okA
			if isRange {
				vb, okB = number(b)
			}
			if okA && (va < f.min || va > f.max) {
				return fmt.Errorf("%s field: %d in %q is outside %d-%d", f.name, va, part, f.min, f.max)
			}
			if okB && (vb < f.min || vb > f.max) {
				return fmt.Errorf("%s field: %d in %q is outside %d-%d", f.name, vb, part, f.min, f.max)
			}
			if okA && okB && va > vb {
				return fmt.Errorf("%s field: the range %q runs backwards", f.name, rng)
			}
			if okA {
				lo = va
			}
		}
		if !hasStep {
			continue
		}
		step, ok := number(stepText)
		if !ok {
			continue // the parser says what is wrong
		}
		span := f.max - f.min
		if step < 1 || step > span {
			return fmt.Errorf("%s field: step %d in %q is outside 1-%d (a larger step would match only %d)", f.name, step, part, span, lo)
		}
	}
	return nil
}

// number parses a decimal field value; names (JAN, MON) are not numbers.
func number(s string) (int, bool) {
	if s == "" || len(s) > 9 {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}
