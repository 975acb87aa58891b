package otel

import (
	"errors"
	"strconv"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/dislock/dislock/core"
)

// Bucket boundaries, in seconds.
var (
	// latencyBuckets cover a round trip to a slow one: 100µs to 30s.
	latencyBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
		0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
	// acquireBuckets cover a round trip to a long wait: 100µs to 1h.
	acquireBuckets = append(append([]float64(nil), latencyBuckets...), 60, 120, 300, 600, 1800, 3600)
	// heldBuckets cover a quick job to a day-long one: 10ms to 24h.
	heldBuckets = []float64{0.01, 0.1, 1, 5, 10, 30, 60, 300, 600, 1800, 3600,
		7200, 21600, 86400}
)

// Observer implements core.Observer, and core.RenewBatchObserver, with
// OpenTelemetry spans and metrics. Install it with core.WithObserver. It is
// safe for concurrent use, and keeps its state apart from any other
// Observer's, so several (of this package or others) compose.
type Observer struct {
	tracer     trace.Tracer
	keyMode    KeyMode
	renewSpans bool
	attrs      []attribute.KeyValue // WithAttributes
	attrsFn    func(string) []attribute.KeyValue

	acquireDur metric.Float64Histogram
	heldDur    metric.Float64Histogram
	renewDur   metric.Float64Histogram
	active     metric.Int64UpDownCounter
	lost       metric.Int64Counter

	mu     sync.RWMutex
	tables map[tableKey]*attrTable
}

var _ core.RenewBatchObserver = (*Observer)(nil)

// New returns an Observer. Without WithTracerProvider and
// WithMeterProvider it uses the global providers.
func New(opts ...Option) (*Observer, error) {
	cfg := config{renewSpans: true}
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if cfg.keyMode < KeyRaw || cfg.keyMode > KeyOmitted {
		return nil, errors.New("dislock/otel: " + cfg.keyOpt + ": unknown KeyMode " + strconv.Itoa(int(cfg.keyMode)))
	}
	for _, kv := range cfg.attrs {
		if !kv.Valid() {
			return nil, errors.New("dislock/otel: WithAttributes: invalid attribute " + strconv.Quote(string(kv.Key)))
		}
	}
	if cfg.tp == nil {
		cfg.tp = otel.GetTracerProvider()
	}
	if cfg.mp == nil {
		cfg.mp = otel.GetMeterProvider()
	}
	o := &Observer{
		tracer:     cfg.tp.Tracer(ScopeName, trace.WithInstrumentationVersion(Version)),
		keyMode:    cfg.keyMode,
		renewSpans: cfg.renewSpans,
		attrs:      cfg.attrs,
		attrsFn:    cfg.attrsFn,
		tables:     make(map[tableKey]*attrTable),
	}
	m := cfg.mp.Meter(ScopeName, metric.WithInstrumentationVersion(Version))
	var err, e error
	o.acquireDur, e = m.Float64Histogram(MetricAcquireDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of lock acquisitions, including waiting."),
		metric.WithExplicitBucketBoundaries(acquireBuckets...))
	err = errors.Join(err, e)
	o.heldDur, e = m.Float64Histogram(MetricSessionDuration, metric.WithUnit("s"),
		metric.WithDescription("How long sessions held their lock, from acquisition to release or loss."),
		metric.WithExplicitBucketBoundaries(heldBuckets...))
	err = errors.Join(err, e)
	o.renewDur, e = m.Float64Histogram(MetricRenewDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of renewal calls, each renewing one or more sessions."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	err = errors.Join(err, e)
	o.active, e = m.Int64UpDownCounter(MetricSessionActive, metric.WithUnit("{session}"),
		metric.WithDescription("Sessions currently held by this process."))
	err = errors.Join(err, e)
	o.lost, e = m.Int64Counter(MetricLeaseLost, metric.WithUnit("{lease}"),
		metric.WithDescription("Leases lost: refused by the store or not renewed in time."))
	err = errors.Join(err, e)
	if err != nil {
		return nil, err
	}
	return o, nil
}
