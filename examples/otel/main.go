// Command otel shows the spans and metrics dislock emits: it installs the
// otel Observer with stdout exporters for traces and metrics, holds a lock
// inside a job's span until its lease was renewed, lets a second node wait
// for the same lock until the job releases it, loses a third lock to a
// thief, and prints every span and then every metric as JSON on stdout.
//
// With no environment it runs on the in-process memlock backend; with
// DATABASE_URL, MYSQL_URL, REDIS_URL, ETCD_URL or ZK_URL set it takes the first two locks on
// that server instead (the lost lease is always provoked on memlock, with
// its Steal hook).
//
//	go -C examples run ./otel
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"go.opentelemetry.io/otel/exporters/stdout/stdoutmetric"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
	"github.com/dislock/dislock/examples/internal/exenv"
	dlotel "github.com/dislock/dislock/otel"
)

func main() { exenv.Main("otel example", run) }

func run(ctx context.Context, out io.Writer) (err error) {
	spans, err := stdouttrace.New(stdouttrace.WithWriter(out), stdouttrace.WithPrettyPrint())
	if err != nil {
		return err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(context.Background())
	metrics, err := stdoutmetric.New(stdoutmetric.WithWriter(out), stdoutmetric.WithPrettyPrint())
	if err != nil {
		return err
	}
	// Metrics are exported when the provider shuts down, after the spans.
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(metrics, sdkmetric.WithInterval(time.Hour))))
	defer func() { err = errors.Join(err, mp.Shutdown(context.Background())) }()

	obs, err := dlotel.New(dlotel.WithTracerProvider(tp), dlotel.WithMeterProvider(mp))
	if err != nil {
		return err
	}
	// A short TTL, so that the lease is renewed within the example's run.
	opts := []core.ClientOption{core.WithObserver(obs), core.WithDefaults(core.TTL(600 * time.Millisecond))}

	// Two nodes on the server the environment names.
	lockers, backend, closeAll, err := exenv.Lockers(ctx, 2, opts...)
	if err != nil {
		return err
	}
	defer closeAll()
	fmt.Fprintln(out, "backend:", backend)
	key := fmt.Sprintf("otel-example/report-%d", time.Now().UnixNano())

	jobCtx, job := tp.Tracer("example").Start(ctx, "nightly-report")
	s, err := lockers[0].TryAcquire(jobCtx, key)
	if err != nil {
		job.End()
		return err
	}

	// The second node waits for the lock (dislock.acquire with
	// dislock.mode=wait, the holder, and what woke it) in its own request.
	type result struct {
		s   core.Session
		err error
	}
	waited := make(chan result, 1)
	go func() {
		wctx, req := tp.Tracer("example").Start(ctx, "nightly-report (second node)")
		defer req.End()
		wctx, cancel := context.WithTimeout(wctx, 30*time.Second)
		defer cancel()
		s, err := lockers[1].Acquire(wctx, key)
		if err == nil {
			err = s.Release(wctx)
		}
		waited <- result{s, err}
	}()

	// The job runs here, passing s.Token() to what it writes, until its
	// lease has been renewed once (a dislock.renew span: the renewal call,
	// its own trace, linked to the acquisition).
	if err := untilRenewed(ctx, s); err != nil {
		job.End()
		return err
	}
	if err := s.Release(jobCtx); err != nil {
		job.End()
		return err
	}
	job.End()
	if r := <-waited; r.err != nil {
		return r.err
	}

	// A lease lost to a thief: memlock's Steal hook stands in for a lock
	// deleted or taken over behind the holder's back.
	store := memlock.NewStore()
	victim, err := store.Locker(opts...)
	if err != nil {
		return err
	}
	defer victim.Close()
	s2, err := victim.TryAcquire(context.Background(), "otel-example/stolen")
	if err != nil {
		return err
	}
	store.Steal("otel-example/stolen")
	<-s2.Done() // the next renewal is refused: dislock.lease_lost, reason "refused"
	if err := victim.Close(); err != nil {
		return err
	}
	return tp.ForceFlush(context.Background())
}

// untilRenewed returns once s's lease has been renewed (its deadline moved).
func untilRenewed(ctx context.Context, s core.Session) error {
	first := s.Deadline()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for s.Deadline().Equal(first) {
		select {
		case <-s.Done():
			return s.Err()
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}
