package etcdtest_test

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dislock/dislock/etcdlock"
	"github.com/dislock/dislock/etcdlock/etcdtest"
	"github.com/dislock/dislock/internal/testenv"
)

// TestParseURLClientSendsNoPingPerMessage: a client made from ParseURL's
// configuration has fixed flow-control windows (etcdlock.StaticWindows):
// watch events that arrive one at a time make it send no HTTP/2 PING, where
// gRPC's default window estimate sends one for nearly every event.
func TestParseURLClientSendsNoPingPerMessage(t *testing.T) {
	c := etcdtest.Start(t, 1)
	admin := c.Client(t)
	const events = 20
	for _, static := range []bool{true, false} {
		t.Run(map[bool]string{true: "ParseURL", false: "default-windows"}[static], func(t *testing.T) {
			pings := &atomic.Int64{}
			addr := pingCounter(t, strings.TrimPrefix(c.DirectEndpoints()[0], "http://"), pings)
			cfg, err := etcdlock.ParseURL("etcd://" + addr)
			if err != nil {
				t.Fatal(err)
			}
			if !static {
				cfg.DialOptions = nil
			}
			cli := etcdtest.NewClient(t, cfg)
			ctx := testenv.Context(t, 20*time.Second)
			key := uniquePrefix("pings") + "k"
			wch := cli.Watch(ctx, key, clientv3.WithCreatedNotify())
			if resp := <-wch; !resp.Created {
				t.Fatalf("watch not created: %v", resp.Err())
			}
			before := pings.Load()
			for i := range events {
				if _, err := admin.Put(ctx, key, string(rune('a'+i))); err != nil {
					t.Fatal(err)
				}
				if resp := <-wch; resp.Err() != nil || len(resp.Events) != 1 {
					t.Fatalf("watch response %d: %v %d events", i, resp.Err(), len(resp.Events))
				}
			}
			n := pings.Load() - before
			t.Logf("%d PINGs for %d watch events", n, events)
			if static && n != 0 {
				t.Errorf("%d PINGs sent for %d watch events, want none", n, events)
			}
			if !static && n < events/2 {
				t.Errorf("%d PINGs sent for %d watch events with gRPC's default windows, want one for most: the count does not see them", n, events)
			}
		})
	}
}

// pingCounter is a TCP proxy to upstream that counts the HTTP/2 PING frames
// (not acknowledgements) its clients send; it returns its address.
func pingCounter(t *testing.T, upstream string, pings *atomic.Int64) string {
	t.Helper()
	l := testenv.Forward(t, "tcp", upstream, func(down, up net.Conn) {
		t.Cleanup(func() { down.Close(); up.Close() })
		go func() { _, _ = io.Copy(down, up); down.Close() }()
		go func() { countPings(io.TeeReader(down, up), pings); up.Close() }()
	})
	t.Cleanup(func() { l.Close() })
	return l.Addr().String()
}

// countPings reads an HTTP/2 client's byte stream, its preface and then
// frames, counting the PING frames without the ACK flag.
func countPings(r io.Reader, pings *atomic.Int64) {
	preface := make([]byte, len("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
	if _, err := io.ReadFull(r, preface); err != nil {
		return
	}
	var head [9]byte
	for {
		if _, err := io.ReadFull(r, head[:]); err != nil {
			return
		}
		length := int64(binary.BigEndian.Uint32(append([]byte{0}, head[:3]...)))
		if head[3] == 0x6 && head[4]&0x1 == 0 {
			pings.Add(1)
		}
		if _, err := io.CopyN(io.Discard, r, length); err != nil && !errors.Is(err, io.EOF) {
			return
		}
	}
}
