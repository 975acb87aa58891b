package main

import (
	"strings"
	"testing"
)

const sample = `goos: linux
BenchmarkUncontended/redis/dislock-2   2960  358958 ns/op  2.000 reqs/op  3.253 x-rtt
BenchmarkUncontended/redis/bsm-2       4765  279825 ns/op  2.000 reqs/op  2.581 x-rtt
BenchmarkHandoff/pg/advisory-2         100   1 ns/op  0.3002 p50-ms  3.019 p50-x-rtt
BenchmarkHandoff/pg/dislock-2          100   1 ns/op  2.971 p50-ms  24.92 p50-x-rtt
PASS
`

func TestChart(t *testing.T) {
	res, err := parse(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if got := res["Uncontended/redis/dislock"]["x-rtt"]; got != 3.253 {
		t.Fatalf("parsed x-rtt %v", got)
	}
	svg, err := chart(res)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<svg", "Redis · dislock", "Redis · bsm/redislock", "3.25×", "PostgreSQL · advisory lock", "24.9×", "</svg>"} {
		if !strings.Contains(svg, want) {
			t.Errorf("chart lacks %q", want)
		}
	}
	if strings.Count(svg, "<rect ") != 5 { // background + 4 bars
		t.Errorf("want 4 bars, got %d rects", strings.Count(svg, "<rect "))
	}
}

func TestChartNeedsResults(t *testing.T) {
	if _, err := chart(map[string]metrics{}); err == nil {
		t.Fatal("no error for an input without results")
	}
}
