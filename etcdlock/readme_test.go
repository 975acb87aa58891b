package etcdlock_test

import (
	"strings"
	"testing"

	"github.com/dislock/dislock/internal/testenv"
)

// The README's etcd snippet is the body of lockOnCluster (Example_cluster),
// which the compiler checks.
func TestReadmeSnippet(t *testing.T) {
	readme := testenv.ReadFile(t, "../README.md")
	const first = "cli, err := clientv3.New(clientv3.Config{\n\tEndpoints:   []string{\"etcd1:2379\""
	i := strings.Index(readme, first)
	if i < 0 {
		t.Fatal("README has no etcd snippet")
	}
	block := readme[i:]
	block = block[:strings.Index(block, "```")]
	src := testenv.ReadFile(t, "example_test.go")
	var body strings.Builder
	for _, line := range strings.Split(src, "\n") {
		body.WriteString(strings.TrimPrefix(line, "\t") + "\n")
	}
	if !strings.Contains(body.String(), block) {
		t.Errorf("the README's etcd snippet differs from lockOnCluster in example_test.go:\n%s", block)
	}
}
