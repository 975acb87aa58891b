// Package extest runs an example program from its tests: on the backend
// one variable of exenv.Variables selects, or on memlock when none is set,
// within a bound, and checks what it printed.
package extest

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/examples/internal/exenv"
)

// Run calls run with only variable of exenv.Variables set, to url (with
// variable "", none: memlock), and a 30s deadline, and returns what run
// wrote. An error from run fails the test, with the output.
func Run(t *testing.T, variable, url string, run func(ctx context.Context, out io.Writer) error) string {
	t.Helper()
	for _, v := range exenv.Variables {
		t.Setenv(v, "")
	}
	if variable != "" {
		t.Setenv(variable, url)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	return out.String()
}

// Contains fails the test for each of wants that got lacks, showing got
// once.
func Contains(t *testing.T, got string, wants ...string) {
	t.Helper()
	missing := false
	for _, want := range wants {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q", want)
			missing = true
		}
	}
	if missing {
		t.Logf("output:\n%s", got)
	}
}
