// Command otel shows the spans dislock emits: it installs the otel Observer
// with a stdout exporter, takes a lock inside a job's span, loses a second
// lock to a thief, and prints every span as JSON on stdout.
//
// With no environment it runs on the in-process memlock backend (the lost
// lease is provoked with memlock's Steal hook); with DATABASE_URL or
// REDIS_URL set it takes the first lock on that server instead.
//
//	go -C examples run ./otel
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
	"github.com/dislock/dislock/examples/internal/exenv"
	dlotel "github.com/dislock/dislock/otel"
)

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "otel example:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out io.Writer) error {
	exp, err := stdouttrace.New(stdouttrace.WithWriter(out), stdouttrace.WithPrettyPrint())
	if err != nil {
		return err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	obs, err := dlotel.New(dlotel.WithTracerProvider(tp))
	if err != nil {
		return err
	}
	withObs := core.WithObserver(obs)

	// The job's lock, on the server the environment names.
	lockers, _, closeAll, err := exenv.Lockers(ctx, 1, withObs)
	if err != nil {
		return err
	}
	defer closeAll()
	locker := lockers[0]

	ctx, job := tp.Tracer("example").Start(ctx, "nightly-report")
	s, err := locker.TryAcquire(ctx, fmt.Sprintf("otel-example/report-%d", time.Now().UnixNano()))
	if err != nil {
		job.End()
		return err
	}
	// ... the job runs here, passing s.Token() to what it writes ...
	if err := s.Release(ctx); err != nil {
		job.End()
		return err
	}
	job.End()

	// A lease lost to a thief: memlock's Steal hook stands in for a lock
	// deleted or taken over behind the holder's back.
	store := memlock.NewStore()
	victim, err := store.Locker(withObs, core.WithDefaults(core.TTL(300*time.Millisecond)))
	if err != nil {
		return err
	}
	defer victim.Close()
	s2, err := victim.TryAcquire(context.Background(), "otel-example/stolen")
	if err != nil {
		return err
	}
	store.Steal("otel-example/stolen")
	<-s2.Done() // the next renewal is refused: dislock.lease_lost
	return tp.ForceFlush(context.Background())
}
