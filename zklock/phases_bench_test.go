package zklock_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/benchtest"
	"github.com/dislock/dislock/internal/zktest"
	"github.com/dislock/dislock/zklock"
)

// BenchmarkHandoffPhases splits one hand-off between two sessions into its
// phases, for dislock and for go-zookeeper's zk.Lock, one of each per
// iteration (the same load): the holder holds the key phaseHold, then
// releases it while the other session waits in line. The frames each
// session writes and reads are timed on its connection, so the phases are
// seen from the wire:
//
//   - send: from the start of the release to the delete's write (the
//     engine's call path on the holder's side);
//   - event: from the delete's write to the waiter's first read (the
//     server's delete and its watch event);
//   - react: from that read to the waiter's next write (dislock: the watch
//     goroutine, the turn, the Acquire's wake-up, the attempt, the call
//     worker and the call's goroutine up to the grant's setData; zk.Lock:
//     the watch channel to its Children);
//   - rtt: that request's round trip (setData, a write, against Children,
//     a read);
//   - return: from the reply's read to the return of the acquire.
//
// Each metric is the phase's median in µs; rtt-*-µs are the medians of
// back-to-back round trips after the hand-offs (Exists, Children of 16,
// setData).
//
//	go test -run '^$' -bench HandoffPhases -benchtime 300x ./zklock/
func BenchmarkHandoffPhases(b *testing.B) {
	const phaseHold = 10 * time.Millisecond
	connect := benchServer(b)
	root := testRoot()
	var wire wireLog
	ctx := context.Background()
	ls := make([]*core.Client, 2)
	for i := range ls {
		ls[i] = benchLocker(b, connect, root, wire.dialer(i))
	}
	servers, _, err := zklock.ParseServers(connect)
	if err != nil {
		b.Fatal(err)
	}
	zc := make([]*zk.Conn, 2)
	for i := range zc {
		c, _, err := zk.Connect(servers, 15*time.Second, zk.WithLogInfo(false), zk.WithLogger(nopLogger{}), zk.WithDialer(wire.dialer(2+i)))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(c.Close)
		zc[i] = c
	}
	raw := benchConn(b, connect, nil)
	var dl, zl phaseSamples
	s, err := ls[0].Acquire(ctx, "handoff")
	if err != nil {
		b.Fatal(err)
	}
	lock := zk.NewLock(zc[0], root+"/zklock-handoff", zk.WorldACL(zk.PermAll))
	if err := lock.Lock(); err != nil {
		b.Fatal(err)
	}
	existsRTT(b, raw) // warm up
	// handoff has the session w wait with wait, the holder hold phaseHold
	// and release with release, and records the phases in into.
	handoff := func(into *phaseSamples, h, w int, wait func() error, release func() error) {
		got := make(chan error, 1)
		go func() { got <- wait() }()
		time.Sleep(phaseHold)
		if _, _, err := raw.Exists("/"); err != nil { // the same idle gap before either release
			b.Fatal(err)
		}
		start := wire.start()
		if err := release(); err != nil {
			b.Fatal(err)
		}
		if err := <-got; err != nil {
			b.Fatal(err)
		}
		into.add(wire.stop(), h, w, time.Since(start))
	}
	b.ResetTimer()
	for i := range b.N {
		h, w := i%2, (i+1)%2
		held := s
		handoff(&dl, h, w, func() (err error) {
			s, err = ls[w].Acquire(ctx, "handoff")
			return err
		}, func() error { return held.Release(ctx) })
		next := zk.NewLock(zc[w], root+"/zklock-handoff", zk.WorldACL(zk.PermAll))
		handoff(&zl, 2+h, 2+w, next.Lock, lock.Unlock)
		lock = next
	}
	b.StopTimer()
	s.Release(ctx)
	lock.Unlock()
	dl.report(b, "dislock")
	zl.report(b, "zklock")
	rtts(b, raw, root)
}

// rtts reports the medians of back-to-back round trips, interleaved: an
// Exists, a Children of a node with 16 children (zk.Lock's read after the
// event) and a setData (dislock's grant).
func rtts(b *testing.B, c *zk.Conn, root string) {
	p := root + "/rtt"
	if _, err := c.Create(p, nil, zk.FlagPersistent, zk.WorldACL(zk.PermAll)); err != nil {
		b.Fatal(err)
	}
	for i := range 16 {
		if _, err := c.Create(fmt.Sprintf("%s/c%02d", p, i), nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
			b.Fatal(err)
		}
	}
	data := zklock.ClaimData(10*time.Second, "owner")
	var ex, ch, set []time.Duration
	for range 400 {
		t0 := time.Now()
		_, _, err1 := c.Exists(p)
		t1 := time.Now()
		_, _, err2 := c.Children(p)
		t2 := time.Now()
		_, err3 := c.Set(p+"/c00", data, -1)
		t3 := time.Now()
		if err := errors.Join(err1, err2, err3); err != nil {
			b.Fatal(err)
		}
		ex, ch, set = append(ex, t1.Sub(t0)), append(ch, t2.Sub(t1)), append(set, t3.Sub(t2))
	}
	for _, m := range []struct {
		name string
		d    []time.Duration
	}{{"exists", ex}, {"children", ch}, {"setdata", set}} {
		slices.Sort(m.d)
		b.ReportMetric(float64(benchtest.Quantile(m.d, 0.5).Microseconds()), "rtt-"+m.name+"-µs")
	}
}

// wireLog times the frames written and read on the connections it dialed
// while a hand-off is being recorded (pings excluded).
type wireLog struct {
	mu     sync.Mutex
	base   time.Time // zero while not recording
	frames []wireFrame
}

type wireFrame struct {
	conn  int
	write bool
	op    int32 // a written request's opcode
	at    time.Duration
}

func (l *wireLog) start() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.frames, l.base = nil, time.Now()
	return l.base
}

func (l *wireLog) stop() []wireFrame {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.base = time.Time{}
	return l.frames
}

// stopCounts stops recording and returns the requests written since
// start, counted by opcode.
func (l *wireLog) stopCounts() map[int32]int {
	count := map[int32]int{}
	for _, f := range l.stop() {
		if f.write {
			count[f.op]++
		}
	}
	return count
}

func (l *wireLog) record(conn int, write bool, op int32) {
	l.mu.Lock()
	if !l.base.IsZero() {
		l.frames = append(l.frames, wireFrame{conn, write, op, time.Since(l.base)})
	}
	l.mu.Unlock()
}

func (l *wireLog) dialer(conn int) func(network, addr string, timeout time.Duration) (net.Conn, error) {
	return func(network, addr string, timeout time.Duration) (net.Conn, error) {
		return zktest.DialWrapped(network, addr, timeout, func(nc net.Conn) net.Conn { return &wireConn{Conn: nc, l: l, id: conn} })
	}
}

type wireConn struct {
	net.Conn
	l  *wireLog
	id int
}

func (c *wireConn) Write(p []byte) (int, error) {
	if len(p) >= 12 && !zktest.IsPing(p) {
		c.l.record(c.id, true, int32(binary.BigEndian.Uint32(p[8:12])))
	}
	return c.Conn.Write(p)
}

func (c *wireConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.l.record(c.id, false, 0)
	}
	return n, err
}

// phaseSamples are the phases of the hand-offs recorded.
type phaseSamples struct{ send, event, react, rtt, ret, total []time.Duration }

const opCreate, opDelete, opExists, opGetData, opSetData, opGetChildren2, opMulti = 1, 2, 3, 4, 5, 12, 14

// add splits one hand-off from the holder's connection h to the waiter's
// w: the delete's write, the waiter's first read after it (the event), its
// next write (the grant or the read of the children) and its last read
// (that request's reply). A hand-off whose waiter was still getting in
// line (it wrote before the event) is left out.
func (ps *phaseSamples) add(fs []wireFrame, h, w int, total time.Duration) {
	var del, ev, req, reply time.Duration = -1, -1, -1, -1
	for _, f := range fs {
		switch {
		case del < 0 && f.conn == w && f.write:
			return // not yet in line
		case del < 0 && f.conn == h && f.write && f.op == opDelete:
			del = f.at
		case del >= 0 && ev < 0 && f.conn == w:
			if f.write {
				return
			}
			ev = f.at
		case ev >= 0 && req < 0 && f.conn == w && f.write:
			req = f.at
		case req >= 0 && f.conn == w && !f.write:
			reply = f.at
		}
	}
	if reply < 0 {
		return
	}
	ps.send = append(ps.send, del)
	ps.event = append(ps.event, ev-del)
	ps.react = append(ps.react, req-ev)
	ps.rtt = append(ps.rtt, reply-req)
	ps.ret = append(ps.ret, total-reply)
	ps.total = append(ps.total, total)
}

func (ps *phaseSamples) report(b *testing.B, who string) {
	if len(ps.total) == 0 {
		b.Fatalf("%s: no hand-off recorded", who)
	}
	for _, m := range []struct {
		name string
		d    []time.Duration
	}{{"send", ps.send}, {"event", ps.event}, {"react", ps.react}, {"rtt", ps.rtt}, {"return", ps.ret}, {"total", ps.total}} {
		slices.Sort(m.d)
		b.ReportMetric(float64(benchtest.Quantile(m.d, 0.5).Microseconds()), who+"-"+m.name+"-µs")
	}
}
