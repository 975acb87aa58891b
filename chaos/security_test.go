package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	dotel "github.com/dislock/dislock/otel"
	"github.com/dislock/dislock/pg"
	"github.com/dislock/dislock/redislock"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// sweep collects every sink of one secret sweep: slog output (the log
// package's too), error strings, and OpenTelemetry spans and metrics.
type sweep struct {
	t      *testing.T
	logs   *sink
	errs   *sink
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	obs    core.Observer
	tp     *sdktrace.TracerProvider
	mp     *sdkmetric.MeterProvider
}

func newSweep(t *testing.T) *sweep {
	s := &sweep{t: t, logs: &sink{}, errs: &sink{}, spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(s.logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() { slog.SetDefault(prev) })
	s.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(s.spans))
	s.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(s.reader))
	o, err := dotel.New(dotel.WithTracerProvider(s.tp), dotel.WithMeterProvider(s.mp), dotel.WithRenewSpans(true))
	if err != nil {
		t.Fatalf("otel observer: %v", err)
	}
	s.obs = core.Observers(o, newRecObserver(NewRecorder(0), "sweep", s.errs))
	return s
}

// err records err (as %v and %+v) and logs it through slog, as an
// application would.
func (s *sweep) err(what string, err error) {
	if err == nil {
		return
	}
	s.errs.err(err)
	slog.Error(what, "err", err)
}

func (s *sweep) clientOptions() []core.ClientOption {
	return []core.ClientOption{core.WithObserver(s.obs), core.WithReleaseTimeout(500 * time.Millisecond),
		core.WithDefaults(shortTiming.options()...)}
}

// finish flushes telemetry and searches every sink for the sentinel.
func (s *sweep) finish(extra ...string) {
	t := s.t
	ctx := context.Background()
	_ = s.tp.ForceFlush(ctx)
	var spans strings.Builder
	for _, st := range tracetest.SpanStubsFromReadOnlySpans(s.spans.Ended()) {
		fmt.Fprintf(&spans, "%+v\n", st)
		b, _ := json.Marshal(st.Attributes)
		spans.Write(b)
		for _, e := range st.Events {
			b, _ := json.Marshal(e.Attributes)
			fmt.Fprintf(&spans, "%s %s\n", e.Name, b)
		}
		spans.WriteString(st.Status.Description + "\n")
	}
	var rm metricdata.ResourceMetrics
	if err := s.reader.Collect(ctx, &rm); err != nil {
		t.Errorf("collect metrics: %v", err)
	}
	metrics, _ := json.Marshal(rm)
	metrics = append(metrics, fmt.Sprintf("%+v", rm)...)
	_ = s.tp.Shutdown(ctx)
	_ = s.mp.Shutdown(ctx)
	if len(s.spans.Ended()) == 0 {
		t.Error("no spans recorded: the sweep saw no telemetry")
	}
	if !strings.Contains(s.errs.String(), "lease lost") {
		t.Error("the sweep provoked no lease loss")
	}
	sinks := append([]string{s.logs.String(), s.errs.String(), spans.String(), string(metrics), libLogs.String()}, extra...)
	checkNoSecret(t, "secret sweep", sinks...)
	t.Logf("searched %d bytes of logs, errors, spans and metrics", len(strings.Join(sinks, "")))
}

// tryAcquire retries TryAcquire for a few seconds: a client may keep
// reporting its last dial error for a second after the network came back.
func (s *sweep) tryAcquire(l core.Locker, key string) (core.Session, error) {
	var err error
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		var sess core.Session
		if sess, err = l.TryAcquire(context.Background(), key); err == nil {
			return sess, nil
		}
		s.err("try", err)
	}
	return nil, err
}

// proxyFaults runs the faults every backend's sweep makes through its
// proxy px (holdThenCut, then dropReplies) on keys of a fresh name, and
// returns that name for the backend's own faults.
func (s *sweep) proxyFaults(l core.Locker, px *Proxy) (key string) {
	key = "sweep-" + fmt.Sprint(time.Now().UnixNano())
	s.holdThenCut(l, px, key)
	s.dropReplies(l, px, key+"-drop")
	return key
}

// holdThenCut acquires key on l, cuts the proxy, waits for the loss, then
// tries everything that can fail while cut, and restores the proxy.
func (s *sweep) holdThenCut(l core.Locker, px *Proxy, key string) {
	ctx := context.Background()
	sess, err := s.tryAcquire(l, key)
	if err != nil {
		s.t.Fatalf("acquire before the cut: %v", err)
	}
	px.Cut()
	select {
	case <-sess.Done():
	case <-time.After(3 * shortTiming.ttl):
		s.t.Errorf("no loss signalled while the store was cut off")
	}
	s.err("session", sess.Err())
	s.err("cause", context.Cause(sess.Context()))
	s.err("release", sess.Release(ctx))
	actx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = l.Acquire(actx, key+"-2")
	cancel()
	s.err("acquire", err)
	_, err = l.TryAcquire(ctx, key+"-3")
	s.err("try", err)
	if a, ok := l.(core.Admin); ok {
		_, _, err = a.Inspect(ctx, key)
		s.err("inspect", err)
		_, err = a.List(ctx, "")
		s.err("list", err)
		_, err = a.ForceRelease(ctx, key)
		s.err("force", err)
	}
	if err := px.Restore(); err != nil {
		s.t.Fatal(err)
	}
}

// dropReplies holds a lock while replies vanish, so that renewals,
// acquisitions and releases time out with their outcome unknown.
func (s *sweep) dropReplies(l core.Locker, px *Proxy, key string) {
	ctx := context.Background()
	sess, err := s.tryAcquire(l, key)
	if err != nil {
		s.t.Fatalf("acquire before dropping replies: %v", err)
	}
	rm, err := px.DropReplies()
	if err != nil {
		s.t.Fatal(err)
	}
	select {
	case <-sess.Done():
	case <-time.After(3 * shortTiming.ttl):
		s.t.Errorf("no loss signalled while replies were dropped")
	}
	s.err("session", sess.Err())
	tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = l.TryAcquire(tctx, key+"-x")
	cancel()
	s.err("try", err)
	rm()
}

func TestSecretSweepPG(t *testing.T) {
	u := pgURL(t)
	ignore := goleakIgnore()
	s := newSweep(t)
	h := NewHarness(s.logs)
	px := addProxy(t, h, "pg-sweep", u.Host)
	ctx := context.Background()
	proxied := viaProxy(u, px.Addr(), "", sentinelPW)
	app := "dislock-chaos-sweep"

	// A working Locker whose URL carries the password, then faults.
	b, err := pg.OpenBackend(ctx, proxied, pg.WithTable(pgTable), pg.WithAutoMigrate())
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	l, err := core.New(b, s.clientOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	key := s.proxyFaults(l, px)
	// Killed server connections.
	sess, err := l.TryAcquire(ctx, key+"-kill")
	if err == nil {
		direct := directPool(t, u, "dislock-chaos-direct")
		_, _ = direct.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name <> 'dislock-chaos-direct' AND usename = current_user AND datname = current_database() AND pid <> pg_backend_pid() AND application_name LIKE 'dislock-chaos-sweep%'`)
		direct.Close()
		s.err("release after kill", sess.Release(ctx))
	}
	s.err("close", l.Close())
	s.err("backend close", b.Close())

	// Pools made from the URL, as users do, with failures at every stage.
	cfg, err := pgxpool.ParseConfig(proxied)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.ConnConfig.ConnectTimeout = 500 * time.Millisecond
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = pg.NewBackend(ctx, pool, pg.WithTable("dislock_chaos_missing_table"))
	s.err("missing table", err)
	if !errors.Is(err, pg.ErrSchema) {
		t.Errorf("missing table: got %v, want ErrSchema", err)
	}
	px.Cut()
	_, err = pg.New(ctx, pool, pg.WithTable(pgTable))
	s.err("new while cut", err)
	_, err = pg.Open(ctx, proxied, pg.WithTable(pgTable))
	s.err("open while cut", err)
	if err := px.Restore(); err != nil {
		t.Fatal(err)
	}
	pool.Close()

	bad := []string{
		strings.Replace(proxied, u.Path, "/dislock_no_such_db", 1),
		strings.Replace(proxied, "sslmode=disable", "sslmode=bogus", 1),
		strings.Replace(proxied, "postgres:"+sentinelPW, "dislock_no_such_role:"+sentinelPW, 1),
		"postgres://postgres:" + sentinelPW + "@127.0.0.1:1/test?sslmode=disable&connect_timeout=1",
		"postgres://postgres:" + sentinelPW + "@127.0.0.1:" + px.Port() + "/test?sslmode=require&connect_timeout=1",
		"postgres://postgres:" + sentinelPW + "@[::1:bad/test",
	}
	for _, raw := range bad {
		if !strings.Contains(raw, sentinelPW) {
			t.Fatalf("sweep URL lost its sentinel: %q", raw)
		}
		b, err := pg.Open(ctx, raw, pg.WithTable(pgTable))
		if err == nil {
			b.Close()
			continue
		}
		s.err("open", err)
	}
	h.Close()
	s.finish()
	if err := findLeaks(ignore); err != nil {
		t.Errorf("goroutines still running: %v", err)
	}
}

func TestSecretSweepRedis(t *testing.T) {
	ignore := goleakIgnore()
	srv := startRedis(t, sentinelPW)
	if srv == nil {
		if ciMode() {
			t.Fatal("redis-server is not installed; the secret sweep needs a private server with a password")
		}
		t.Skip("redis-server is not installed")
	}
	other := startRedis(t, "a-different-password")
	s := newSweep(t)
	h := NewHarness(s.logs)
	px := addProxy(t, h, "redis-sweep", srv.addr())
	rt := &redisTarget{srv: srv, addr: srv.addr(), pass: sentinelPW}
	rt.base, _ = rt.base.Parse("redis://127.0.0.1/0")
	ctx := context.Background()

	client := redis.NewClient(rt.proxiedOptions(t, px))
	l, err := redislock.New(client, redislock.WithPrefix("dislock-sweep"), redislock.WithClientOptions(s.clientOptions()...),
		redislock.WithSubscribeTimeout(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	key := s.proxyFaults(l, px)
	// A paused server.
	sess, err := s.tryAcquire(l, key+"-pause")
	if err == nil {
		direct := rt.directClient()
		_ = direct.Do(ctx, "CLIENT", "PAUSE", 1500, "ALL").Err()
		direct.Close()
		select {
		case <-sess.Done():
		case <-time.After(3 * time.Second):
		}
		s.err("paused", sess.Err())
		s.err("release", sess.Release(ctx))
	}
	// A restarted, empty server.
	time.Sleep(1600 * time.Millisecond)
	sess, err = s.tryAcquire(l, key+"-restart")
	if err == nil {
		srv.kill()
		if err := srv.start(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-sess.Done():
		case <-time.After(3 * time.Second):
			t.Error("no loss signalled after the store restarted empty")
		}
		s.err("restarted", sess.Err())
	}
	s.err("close", l.Close())
	s.err("client close", client.Close())

	// The right password for another server, and no server at all.
	for _, addr := range []string{other.addr(), "127.0.0.1:1"} {
		opts, err := redis.ParseURL("redis://:" + sentinelPW + "@" + addr + "/0")
		if err != nil {
			t.Fatal(err)
		}
		opts.MaxRetries = -1
		c := redis.NewClient(opts)
		l, err := redislock.New(c, redislock.WithClientOptions(s.clientOptions()...))
		if err != nil {
			s.err("new", err)
			c.Close()
			continue
		}
		_, err = l.TryAcquire(ctx, key+"-auth")
		s.err("wrong server", err)
		if err == nil {
			t.Errorf("acquired on %s with the wrong password", addr)
		}
		s.err("close", l.Close())
		c.Close()
	}
	h.Close()
	s.finish()
	if err := findLeaks(ignore); err != nil {
		t.Errorf("goroutines still running: %v", err)
	}
}

// TestSecretSearchFindsLeaks shows the sweep's search would catch a leak in
// each way the sinks are filled.
func TestSecretSearchFindsLeaks(t *testing.T) {
	u := "postgres://postgres:" + sentinelPW + "@127.0.0.1:5432/test"
	leaky := fmt.Errorf("connect %s: %w", u, errors.New("refused"))
	s := &sink{}
	s.err(fmt.Errorf("wrapped: %w", leaky))
	h := History{Events: []Event{{Kind: AcquireUnknown, Err: leaky.Error()}}}
	for i, text := range []string{s.String(), historyText(h)} {
		if len(secretHits(text)) == 0 {
			t.Errorf("sink %d: the search missed the sentinel", i)
		}
	}
	if hits := secretHits("postgres://postgres:xxxxx@127.0.0.1"); len(hits) != 0 {
		t.Errorf("false positive: %q", hits)
	}
}
