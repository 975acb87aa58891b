package bench

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// BenchmarkServerInstructions: the Redis server's instructions per
// uncontended acquire + release, counted by callgrind, so that no machine
// load moves them, beside a PING's counted the same way (x-ping-instr is
// their ratio). scripts/bench-instr.sh runs it on a redis-server of its own
// under valgrind; without DISLOCK_BENCH_CALLGRIND (that server's pid) it is
// skipped. The count covers everything the server ran in the window:
// reading and parsing the requests, the commands and scripts, writing the
// replies, and its timer (the script starts it with hz 1).
func BenchmarkServerInstructions(b *testing.B) {
	pid := os.Getenv("DISLOCK_BENCH_CALLGRIND")
	if pid == "" {
		b.Skip("DISLOCK_BENCH_CALLGRIND unset: run scripts/bench-instr.sh")
	}
	out := os.Getenv("DISLOCK_BENCH_CALLGRIND_OUT")
	each(b, map[string][]string{"redis": redisContenders}, func(b *testing.B, st *store, which string, _ func() int64) {
		c := contenderFor(b, st, which)
		ctx := bg(b)
		key := name(which, "instr")
		op := c.cycle(ctx, b, key)
		op() // first use of the key, connections and scripts
		ping := serverInstructions(b, pid, out, func() {
			for range b.N {
				if err := st.rt(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.ResetTimer()
		ops := serverInstructions(b, pid, out, func() {
			for range b.N {
				op()
			}
		})
		b.StopTimer()
		b.ReportMetric(ops/float64(b.N), "srv-instr/op")
		b.ReportMetric(ping/float64(b.N), "srv-instr/ping")
		b.ReportMetric(ops/ping, "x-ping-instr")
	})
}

// serverInstructions runs f and returns the instructions the server under
// callgrind (process pid, dumping to files named out.N) ran meanwhile.
func serverInstructions(b *testing.B, pid, out string, f func()) float64 {
	b.Helper()
	control := func(arg string) {
		if o, err := exec.Command("callgrind_control", arg, pid).CombinedOutput(); err != nil {
			b.Fatalf("callgrind_control %s %s: %v: %s", arg, pid, err, o)
		}
	}
	control("-z")
	f()
	control("-d")
	dumps, err := filepath.Glob(out + ".*")
	if err != nil || len(dumps) == 0 {
		b.Fatalf("no callgrind dump %s.*: %v", out, err)
	}
	last, lastN := "", -1
	for _, d := range dumps {
		if n, err := strconv.Atoi(d[len(out)+1:]); err == nil && n > lastN {
			last, lastN = d, n
		}
	}
	fh, err := os.Open(last)
	if err != nil {
		b.Fatal(err)
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "summary: "); ok {
			n, err := strconv.ParseFloat(strings.Fields(v)[0], 64)
			if err != nil {
				b.Fatalf("callgrind dump %s: %v", last, err)
			}
			return n
		}
	}
	b.Fatalf("callgrind dump %s has no summary line", last)
	return 0
}
