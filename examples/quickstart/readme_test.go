package main

import (
	"strings"
	"testing"

	"github.com/dislock/dislock/internal/testenv"
)

// The README's quick start is the body of core's Example, which the core
// tests compile and run: this keeps the two from drifting apart.
func TestReadmeQuickStartIsTheExample(t *testing.T) {
	readme := testenv.ReadFile(t, "../../README.md")
	example := testenv.ReadFile(t, "../../core/example_test.go")
	_, block, ok := strings.Cut(readme, "```go\n")
	if !ok {
		t.Fatal("README has no Go block")
	}
	block, _, _ = strings.Cut(block, "```")
	_, body, ok := strings.Cut(example, "func Example() {\n")
	if !ok {
		t.Fatal("core/example_test.go has no Example")
	}
	body, _, _ = strings.Cut(body, "\n}\n")
	var want []string
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "// Output:") {
			want = append(want, strings.TrimPrefix(line, "\t"))
		}
	}
	if got, w := strings.TrimSpace(block), strings.TrimSpace(strings.Join(want, "\n")); got != w {
		t.Fatalf("README quick start differs from core's Example:\n--- README\n%s\n--- Example\n%s", got, w)
	}
}
