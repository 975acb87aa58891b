package otel

import (
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the tracer and the meter: the
// package's import path.
const ScopeName = "github.com/dislock/dislock/otel"

// Version is the instrumentation version reported with ScopeName.
const Version = "0.2.0"

// KeyMode says how the lock key appears on spans. Keys never appear on
// metrics, whatever the mode.
type KeyMode int

const (
	// KeyRaw puts the key as is in the dislock.key span attribute (default).
	KeyRaw KeyMode = iota
	// KeyHashed puts the hex SHA-256 of the key in dislock.key.sha256
	// instead. It hides the key from casual readers; a key that can be
	// guessed (a job name, say) can still be confirmed by hashing the guess.
	KeyHashed
	// KeyOmitted leaves the key out of spans entirely.
	KeyOmitted
)

// String returns "raw", "hashed" or "omitted".
func (m KeyMode) String() string {
	switch m {
	case KeyRaw:
		return "raw"
	case KeyHashed:
		return "hashed"
	case KeyOmitted:
		return "omitted"
	}
	return "KeyMode(" + strconv.Itoa(int(m)) + ")"
}

// Option configures an Observer.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	tp         trace.TracerProvider
	mp         metric.MeterProvider
	keyMode    KeyMode
	keyOpt     string // the option that set keyMode, for its error
	renewSpans bool
	attrs      []attribute.KeyValue
	attrsFn    func(key string) []attribute.KeyValue
}

// WithTracerProvider sets the TracerProvider spans are created with. Without
// it (or with nil) the global provider at the time New is called is used.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) {
		if tp != nil {
			c.tp = tp
		}
	})
}

// WithMeterProvider sets the MeterProvider instruments are created with.
// Without it (or with nil) the global provider at the time New is called is
// used.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) {
		if mp != nil {
			c.mp = mp
		}
	})
}

// WithKeyMode sets how the lock key appears on spans (default KeyRaw). When
// the key is hashed or omitted it is also removed from error messages
// recorded on spans.
func WithKeyMode(m KeyMode) Option {
	return optionFunc(func(c *config) { c.keyMode, c.keyOpt = m, "WithKeyMode" })
}

// WithKey is WithKeyMode.
//
// Deprecated: use WithKeyMode. The name said too little, and
// asynqlock.WithKey (now asynqlock.Key) took a key function.
func WithKey(m KeyMode) Option {
	return optionFunc(func(c *config) { c.keyMode, c.keyOpt = m, "WithKey" })
}

// WithRenewSpans turns the span of each renewal call on or off (default
// on). A renewal call renews many sessions in one round trip; its span is
// the root of its own trace, linked to the sessions' acquire spans, and
// the parent of the backend driver's spans for that call. Off, only calls
// that fail get a span (started when the call ends, backdated to its
// start), and a tracing driver's spans of the other calls have no parent.
// Renewal durations are measured either way.
func WithRenewSpans(on bool) Option {
	return optionFunc(func(c *config) { c.renewSpans = on })
}

// WithAttributes adds attributes to every span and every measurement, such
// as the service's deployment or a tenant the process serves. They must
// come from a small, fixed set: on metrics every distinct value is a new
// time series. dislock's own attributes win over these on a name clash.
// Repeated options add up.
func WithAttributes(attrs ...attribute.KeyValue) Option {
	return optionFunc(func(c *config) { c.attrs = append(c.attrs, attrs...) })
}

// WithMetricAttributesFn adds attributes to every measurement of a session,
// computed once from its key when the acquisition starts (for example a job
// name taken from a key prefix). fn must map the keys of a process to a
// small, bounded set of values: every distinct value is a new time series.
// fn is called concurrently. Measurements with extra attributes allocate an
// attribute set each; without this option they allocate none. A renewal
// call, which serves many sessions, is measured without them.
func WithMetricAttributesFn(fn func(key string) []attribute.KeyValue) Option {
	return optionFunc(func(c *config) { c.attrsFn = fn })
}
