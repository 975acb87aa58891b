package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// Harness runs toxiproxy in-process: one TCP proxy per server, each on a
// free loopback port. It never opens the toxiproxy HTTP API.
type Harness struct {
	srv *toxiproxy.ApiServer
	mu  sync.Mutex
	all []*Proxy
}

// NewHarness returns a Harness that logs to w (nothing when w is nil).
func NewHarness(w io.Writer) *Harness {
	logger := zerolog.Nop()
	if w != nil {
		logger = zerolog.New(w).Level(zerolog.WarnLevel)
	}
	return &Harness{srv: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), logger)}
}

// Proxy is one fault proxy in front of one server.
type Proxy struct {
	p    *toxiproxy.Proxy
	addr string
	mu   sync.Mutex
	cut  bool
}

// Add starts a proxy to upstream (a loopback host:port) and returns it.
func (h *Harness) Add(name, upstream string) (*Proxy, error) {
	if err := loopback(upstream); err != nil {
		return nil, err
	}
	p := toxiproxy.NewProxy(h.srv, name, "127.0.0.1:0", upstream)
	if err := h.srv.Collection.Add(p, true); err != nil {
		return nil, fmt.Errorf("chaos: start proxy %s: %w", name, err)
	}
	px := &Proxy{p: p, addr: p.Listen}
	h.mu.Lock()
	h.all = append(h.all, px)
	h.mu.Unlock()
	return px, nil
}

// Close stops every proxy and drops its connections.
func (h *Harness) Close() {
	_ = h.srv.Collection.Clear()
}

func loopback(hostport string) error {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return fmt.Errorf("chaos: upstream %q: %w", hostport, err)
	}
	ip := net.ParseIP(host)
	if host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("chaos: upstream %q is not a loopback address", hostport)
	}
	return nil
}

// Addr is the proxy's listen address (host:port).
func (p *Proxy) Addr() string { return p.addr }

// Port is the proxy's listen port.
func (p *Proxy) Port() string {
	_, port, _ := net.SplitHostPort(p.addr)
	return port
}

// Cut stops the proxy: existing connections are closed and new ones
// refused, as when a network link goes down.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.p.Stop()
	p.cut = true
}

// Restore restarts a cut proxy on the same port.
func (p *Proxy) Restore() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.cut {
		return nil
	}
	if err := p.p.Start(); err != nil {
		return fmt.Errorf("chaos: restart proxy %s: %w", p.p.Name, err)
	}
	p.cut = false
	return nil
}

// Toxic adds a toxic; it applies to open connections too. stream is
// "upstream" (client to server) or "downstream" (server to client). The
// returned function removes it.
func (p *Proxy) Toxic(name, typ, stream string, attrs map[string]any) (remove func(), err error) {
	body, err := json.Marshal(map[string]any{
		"name": name, "type": typ, "stream": stream, "toxicity": 1.0, "attributes": attrs,
	})
	if err != nil {
		return nil, err
	}
	if _, err := p.p.Toxics.AddToxicJson(strings.NewReader(string(body))); err != nil {
		return nil, fmt.Errorf("chaos: add toxic %s: %w", name, err)
	}
	return func() { _ = p.p.Toxics.RemoveToxic(context.Background(), name) }, nil
}

// DropReplies swallows every byte the server sends until removed, keeping
// connections open (a timeout toxic with no timeout, downstream).
func (p *Proxy) DropReplies() (func(), error) {
	return p.Toxic("drop", "timeout", "downstream", map[string]any{"timeout": 0})
}

// Latency delays every reply by ms milliseconds.
func (p *Proxy) Latency(ms int) (func(), error) {
	return p.Toxic("latency", "latency", "downstream", map[string]any{"latency": ms, "jitter": 0})
}

// ResetPeer resets (TCP RST) every connection that sends data until
// removed.
func (p *Proxy) ResetPeer() (func(), error) {
	return p.Toxic("reset", "reset_peer", "upstream", map[string]any{"timeout": 0})
}
