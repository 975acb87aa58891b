package cronspec

import (
	"errors"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	for _, c := range []struct {
		spec    string
		seconds bool
		want    string // "" accepted; else a part of the error
	}{
		{"*/5 * * * *", false, ""},
		{"*/59 * * * *", false, ""},
		{"0-30/10 1,2 * JAN-MAR MON", false, ""},
		{"CRON_TZ=Europe/Berlin 0 3 * * *", false, ""},
		{"@hourly", false, ""},
		{"@every 10m", false, ""},
		{"*/61 * * * *", false, "minute field: step 61"},
		{"*/60 * * * *", false, "minute field: step 60"},
		{"5/0 * * * *", false, "minute field: step 0"},
		{"0 */24 * * *", false, "hour field: step 24"},
		{"0 0 */31 * *", false, "day of month field: step 31"},
		{"0 0 * */12 *", false, "month field: step 12"},
		{"0 0 * * */7", false, "day of week field: step 7"},
		{"TZ=UTC */61 * * * *", false, "minute field"},
		{"70 * * * *", false, "minute field: 70"},
		{"5-70 * * * *", false, "minute field: 70"},
		{"0 0 0 * *", false, "day of month field: 0"},
		{"30-10 * * * *", false, "minute field: the range"},
		{"*/61 * * * * *", true, "second field: step 61"},
		{"0 */61 * * * *", true, "minute field: step 61"},
		{"*/61 * * * *", true, "minute field: step 61"},
		{"*/30 * * * * *", true, ""},
	} {
		err := Check(c.spec, c.seconds)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("Check(%q, %v): %v", c.spec, c.seconds, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("Check(%q, %v) = %v, want an error with %q", c.spec, c.seconds, err, c.want)
		}
	}
	var fc *FieldCountError
	if err := Check("*/30 * * * * *", false); !errors.As(err, &fc) || fc.Got != 6 {
		t.Errorf("6 fields without seconds: %v", err)
	}
}
