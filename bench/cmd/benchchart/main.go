// Command benchchart turns the output of the bench module's benchmarks
// (`go test -bench` text, as scripts/bench.sh records it) into an SVG chart
// of dislock beside its peers: the cost of an uncontended acquire+release
// and the hand-off latency with 16 waiting processes, both as multiples of
// the raw server round trip measured in the same run.
//
//	go run ./cmd/benchchart -o chart.svg results/bench-….txt
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
)

func main() {
	if err := run(os.Args[1:], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benchchart:", err)
		os.Exit(1)
	}
}

func run(args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("benchchart", flag.ContinueOnError)
	out := fs.String("o", "", "write the SVG to this file (default: standard output)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	in := stdin
	if fs.NArg() > 0 {
		f, err := os.Open(fs.Arg(0))
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	results, err := parse(in)
	if err != nil {
		return err
	}
	svg, err := chart(results)
	if err != nil {
		return err
	}
	if *out == "" {
		_, err = io.WriteString(stdout, svg)
		return err
	}
	return os.WriteFile(*out, []byte(svg), 0o644)
}

// metrics are one benchmark's reported values by unit.
type metrics map[string]float64

// parse reads benchmark lines: "BenchmarkX/store/who-2  N  v unit  v unit…".
func parse(r io.Reader) (map[string]metrics, error) {
	res := map[string]metrics{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name := strings.TrimPrefix(f[0], "Benchmark")
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i]
			}
		}
		m := metrics{}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			m[f[i+1]] = v
		}
		res[name] = m
	}
	return res, sc.Err()
}

type bar struct {
	label string
	value float64
	ours  bool
}

type panel struct {
	title string
	log   bool
	bars  []bar
}

// pick collects metric unit of bench/store/who for each who that ran.
func pick(res map[string]metrics, bench, unit string) []bar {
	var bars []bar
	for _, store := range []string{"redis", "pg"} {
		for _, who := range []string{"dislock", "dislock-async", "raw", "bsm", "redsync", "ttlrow", "advisory"} {
			m, ok := res[bench+"/"+store+"/"+who]
			if !ok {
				continue
			}
			v, ok := m[unit]
			if !ok || v <= 0 {
				continue
			}
			storeName := map[string]string{"redis": "Redis", "pg": "PostgreSQL"}[store]
			bars = append(bars, bar{label: storeName + " · " + peerName(who), value: v, ours: strings.HasPrefix(who, "dislock")})
		}
	}
	return bars
}

func peerName(who string) string {
	switch who {
	case "bsm":
		return "bsm/redislock"
	case "raw":
		return "raw SET NX + DEL"
	case "ttlrow":
		return "plain TTL row"
	case "advisory":
		return "advisory lock"
	case "dislock-async":
		return "dislock (async commit)"
	}
	return who
}

func chart(res map[string]metrics) (string, error) {
	panels := []panel{
		{title: "Uncontended acquire + release, × raw round trip (lower is better)", bars: pick(res, "Uncontended", "x-rtt")},
		{title: "Hand-off p50, 16 waiting processes, × raw round trip (log scale, lower is better)", log: true, bars: pick(res, "Handoff", "p50-x-rtt")},
	}
	n := 0
	for _, p := range panels {
		n += len(p.bars)
	}
	if n == 0 {
		return "", errors.New("no Uncontended or Handoff results in the input")
	}
	const (
		width  = 800
		labelW = 260
		barH   = 18
		gap    = 6
		titleH = 34
		right  = 70
	)
	var b strings.Builder
	height := 10
	for _, p := range panels {
		height += titleH + len(p.bars)*(barH+gap) + 16
	}
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	y := 10
	plotW := float64(width - labelW - right)
	for _, p := range panels {
		fmt.Fprintf(&b, `<text x="10" y="%d" font-size="14" font-weight="bold">%s</text>`+"\n", y+20, esc(p.title))
		y += titleH
		maxV := 0.0
		for _, br := range p.bars {
			maxV = math.Max(maxV, br.value)
		}
		scale := func(v float64) float64 {
			if p.log {
				// 1× at the axis, the largest value at the right end.
				top := math.Log10(math.Max(maxV, 10))
				return plotW * math.Max(math.Log10(math.Max(v, 1)), 0.02) / top
			}
			return plotW * v / maxV
		}
		for _, br := range p.bars {
			fill := "#9aa5b1"
			if br.ours {
				fill = "#1f77b4"
			}
			w := scale(br.value)
			fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", labelW-8, y+barH-5, esc(br.label))
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", labelW, y, w, barH, fill)
			fmt.Fprintf(&b, `<text x="%.1f" y="%d">%s×</text>`+"\n", float64(labelW)+w+5, y+barH-5, strconv.FormatFloat(br.value, 'f', precision(br.value), 64))
			y += barH + gap
		}
		y += 16
	}
	b.WriteString("</svg>\n")
	return b.String(), nil
}

func precision(v float64) int {
	if v >= 100 {
		return 0
	}
	if v >= 10 {
		return 1
	}
	return 2
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
