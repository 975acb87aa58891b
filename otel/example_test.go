package otel_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sort"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
	dlotel "github.com/dislock/dislock/otel"
)

// Spans go to stdout as JSON. Point WithTracerProvider at your SDK's
// provider, or leave it out to use the global one.
func Example() {
	ctx := context.Background()
	exp, err := stdouttrace.New(stdouttrace.WithPrettyPrint())
	if err != nil {
		log.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(ctx)

	obs, err := dlotel.New(dlotel.WithTracerProvider(tp))
	if err != nil {
		log.Fatal(err)
	}
	locker, err := memlock.New(core.WithObserver(obs))
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	ctx, job := tp.Tracer("example").Start(ctx, "nightly-report")
	defer job.End()
	s, err := locker.TryAcquire(ctx, "nightly-report")
	if err != nil {
		log.Fatal(err)
	}
	// ... the job runs here, passing s.Token() to what it writes ...
	if err := s.Release(ctx); err != nil {
		log.Fatal(err)
	}
}

// The spans and metrics of one busy and one successful acquisition, made
// and released inside a job's span.
func Example_telemetry() {
	ctx := context.Background()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	obs, err := dlotel.New(dlotel.WithTracerProvider(tp), dlotel.WithMeterProvider(mp))
	if err != nil {
		log.Fatal(err)
	}

	store := memlock.NewStore()
	a, _ := store.Locker(core.WithObserver(obs))
	b, _ := store.Locker(core.WithObserver(obs))
	defer a.Close()
	defer b.Close()

	ctx, job := tp.Tracer("example").Start(ctx, "job")
	s, err := a.TryAcquire(ctx, "nightly-report")
	if err != nil {
		log.Fatal(err)
	}
	_, err = b.TryAcquire(ctx, "nightly-report") // busy: an outcome, not an error
	fmt.Println("second try busy:", errors.Is(err, core.ErrNotAcquired))
	s.Release(ctx)
	job.End()

	names := map[string]string{}
	for _, sp := range spans.Ended() {
		names[sp.SpanContext().SpanID().String()] = sp.Name()
	}
	for _, sp := range spans.Ended() {
		fmt.Printf("span %s (parent %q) status=%s", sp.Name(), names[sp.Parent().SpanID().String()], sp.Status().Code)
		for _, k := range []attribute.Key{dlotel.AttrMode, dlotel.AttrOutcome, dlotel.AttrToken, dlotel.AttrHolderToken} {
			for _, kv := range sp.Attributes() {
				if kv.Key == k {
					fmt.Printf(" %s=%s", k, kv.Value.Emit())
				}
			}
		}
		fmt.Println()
	}

	var rm metricdata.ResourceMetrics
	reader.Collect(ctx, &rm)
	var lines []string
	for _, m := range rm.ScopeMetrics[0].Metrics {
		switch d := m.Data.(type) {
		case metricdata.Histogram[float64]:
			for _, dp := range d.DataPoints {
				lines = append(lines, fmt.Sprintf("metric %s %s count=%d", m.Name, enc(dp.Attributes), dp.Count))
			}
		case metricdata.Sum[int64]:
			for _, dp := range d.DataPoints {
				lines = append(lines, fmt.Sprintf("metric %s %s value=%d", m.Name, enc(dp.Attributes), dp.Value))
			}
		}
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// second try busy: true
	// span dislock.acquire (parent "job") status=Unset dislock.mode=try dislock.outcome=acquired dislock.token=1
	// span dislock.acquire (parent "job") status=Unset dislock.mode=try dislock.outcome=busy dislock.holder.token=1
	// span dislock.release (parent "job") status=Unset dislock.mode=try dislock.outcome=released dislock.token=1
	// span job (parent "") status=Unset
	// metric dislock.acquire.duration dislock.backend=memory,dislock.mode=try,dislock.outcome=acquired,dislock.slot=false count=1
	// metric dislock.acquire.duration dislock.backend=memory,dislock.mode=try,dislock.outcome=busy,dislock.slot=false count=1
	// metric dislock.session.active dislock.backend=memory,dislock.mode=try,dislock.slot=false value=0
	// metric dislock.session.duration dislock.backend=memory,dislock.mode=try,dislock.outcome=released,dislock.slot=false count=1
}

func enc(s attribute.Set) string { return s.Encoded(attribute.DefaultEncoder()) }

// Two Observers, each with its own TracerProvider and static attributes,
// composed on one Locker: each records every span, and both spans are
// children of the caller's span.
func Example_composed() {
	ctx := context.Background()
	recA, recB := tracetest.NewSpanRecorder(), tracetest.NewSpanRecorder()
	tpA := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recA))
	tpB := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recB))
	a, err := dlotel.New(dlotel.WithTracerProvider(tpA), dlotel.WithAttributes(attribute.String("team", "billing")))
	if err != nil {
		log.Fatal(err)
	}
	b, err := dlotel.New(dlotel.WithTracerProvider(tpB))
	if err != nil {
		log.Fatal(err)
	}
	locker, err := memlock.New(core.WithObserver(a), core.WithObserver(b))
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	ctx, job := tpA.Tracer("example").Start(ctx, "job")
	s, err := locker.TryAcquire(ctx, "nightly-report")
	if err != nil {
		log.Fatal(err)
	}
	s.Release(ctx)
	job.End()

	for name, rec := range map[string]*tracetest.SpanRecorder{"A": recA, "B": recB} {
		for _, sp := range rec.Ended() {
			if sp.Name() == "job" {
				continue
			}
			team := "-"
			for _, kv := range sp.Attributes() {
				if kv.Key == "team" {
					team = kv.Value.Emit()
				}
			}
			fmt.Printf("%s: %s child of job: %v, team=%s\n", name, sp.Name(), sp.Parent().SpanID() == job.SpanContext().SpanID(), team)
		}
	}
	// Unordered output:
	// A: dislock.acquire child of job: true, team=billing
	// A: dislock.release child of job: true, team=billing
	// B: dislock.acquire child of job: true, team=-
	// B: dislock.release child of job: true, team=-
}
