package optcheck

import (
	"errors"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
)

type config struct {
	n    int
	errs []error
}

func (c *config) RecordErr(err error) { c.errs = append(c.errs, err) }

// The errors match core.ErrInvalidOption and name the package and the
// option as each package always did; Checked applies only a valid value.
func TestOptions(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string // after core.ErrInvalidOption's message; "" for nil
	}{
		{Prefix("zklock.").Invalid("WithRoot", "%q is not an absolute znode path", "x"), `: zklock.WithRoot: "x" is not an absolute znode path`},
		{Positive(Prefix("asynqlock: "), "Grace", time.Duration(0)), ": asynqlock: Grace: must be positive, got 0s"},
		{NotNegative(Prefix("gocronlock: "), "Jitter", -1), ": gocronlock: Jitter: must not be negative, got -1"},
		{Positive(Prefix("p: "), "N", 1), ""},
		{NotNegative(Prefix("p: "), "D", time.Duration(0)), ""},
	} {
		if c.want == "" {
			if c.err != nil {
				t.Errorf("valid value: %v", c.err)
			}
			continue
		}
		if !errors.Is(c.err, core.ErrInvalidOption) || c.err.Error() != core.ErrInvalidOption.Error()+c.want {
			t.Errorf("got %v, want ErrInvalidOption%s", c.err, c.want)
		}
	}
	var cfg config
	bad := errors.New("bad")
	Checked(nil, func(c *config) { c.n = 1 })(&cfg)
	Checked(bad, func(c *config) { c.n = 2 })(&cfg)
	if cfg.n != 1 || len(cfg.errs) != 1 || cfg.errs[0] != bad {
		t.Errorf("after a valid and an invalid option: n=%d errs=%v, want 1 and [bad]", cfg.n, cfg.errs)
	}
}
