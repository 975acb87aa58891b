package etcdlock_test

import (
	"os"
	"strings"
	"testing"
)

// The README's etcd snippet is the body of lockOnCluster (Example_cluster),
// which the compiler checks.
func TestReadmeSnippet(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	const first = `cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"etcd1:2379"`
	i := strings.Index(string(readme), first)
	if i < 0 {
		t.Fatal("README has no etcd snippet")
	}
	block := string(readme)[i:]
	block = block[:strings.Index(block, "```")]
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	var body strings.Builder
	for _, line := range strings.Split(string(src), "\n") {
		body.WriteString(strings.TrimPrefix(line, "\t") + "\n")
	}
	if !strings.Contains(body.String(), block) {
		t.Errorf("the README's etcd snippet differs from lockOnCluster in example_test.go:\n%s", block)
	}
}
