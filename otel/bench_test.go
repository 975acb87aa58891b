package otel_test

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
	"github.com/dislock/dislock/internal/benchtest"
	dlotel "github.com/dislock/dislock/otel"
)

// BenchmarkTryAcquireRelease measures one TryAcquire and Release on memlock:
// without an observer, with the observer on the (no-op) global providers,
// and with the observer on SDK providers that record every span (exported
// nowhere) and aggregate every measurement.
func BenchmarkTryAcquireRelease(b *testing.B) {
	run := func(b *testing.B, opts ...core.ClientOption) {
		l, err := memlock.New(opts...)
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		benchtest.TryAcquireRelease(b, l, "bench")
	}
	b.Run("none", func(b *testing.B) { run(b) })
	b.Run("observer-noop", func(b *testing.B) {
		obs, err := dlotel.New()
		if err != nil {
			b.Fatal(err)
		}
		run(b, core.WithObserver(obs))
	})
	b.Run("observer-sdk", func(b *testing.B) {
		tp := sdktrace.NewTracerProvider()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		defer tp.Shutdown(context.Background())
		defer mp.Shutdown(context.Background())
		obs, err := dlotel.New(dlotel.WithTracerProvider(tp), dlotel.WithMeterProvider(mp))
		if err != nil {
			b.Fatal(err)
		}
		run(b, core.WithObserver(obs))
	})
}
