package otel

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/dislock/dislock/core"
)

// Metric attribute sets, built once per (backend, mode, slot).

type tableKey struct {
	backend, mode string
	slot          bool
}

type mopts struct {
	rec []metric.RecordOption
	add []metric.AddOption
}

func newMopts(kvs ...attribute.KeyValue) mopts {
	o := metric.WithAttributeSet(attribute.NewSet(kvs...))
	return mopts{rec: []metric.RecordOption{o}, add: []metric.AddOption{o}}
}

type attrTable struct {
	base         []attribute.KeyValue // static attributes, then backend, mode, slot
	mode         string
	slot         bool
	session      mopts
	acquired     mopts
	busy         mopts
	timeout      mopts
	renewed      mopts
	heldReleased mopts
	heldLost     mopts
	lostRefused  mopts
	lostDeadline mopts
}

// table returns the cached attribute sets for sessions of backend, mode
// and slot; mode "" is for renewal calls, which serve many sessions.
func (o *Observer) table(backend, mode string, slot bool) *attrTable {
	k := tableKey{backend, mode, slot}
	o.mu.RLock()
	t := o.tables[k]
	o.mu.RUnlock()
	if t != nil {
		return t
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if t = o.tables[k]; t != nil {
		return t
	}
	// dislock's own attributes come last: attribute.NewSet keeps the last
	// of duplicates, so static ones cannot override them.
	base := append([]attribute.KeyValue(nil), o.attrs...)
	base = append(base, AttrBackend.String(BackendName(backend)))
	if mode != "" {
		base = append(base, AttrMode.String(mode), AttrSlot.Bool(slot))
	}
	with := func(kvs ...attribute.KeyValue) mopts {
		return newMopts(append(append([]attribute.KeyValue(nil), base...), kvs...)...)
	}
	t = &attrTable{
		base: base, mode: mode, slot: slot,
		session:      with(),
		acquired:     with(AttrOutcome.String(OutcomeAcquired)),
		busy:         with(AttrOutcome.String(OutcomeBusy)),
		timeout:      with(AttrOutcome.String(OutcomeTimeout)),
		renewed:      with(AttrOutcome.String(OutcomeRenewed)),
		heldReleased: with(AttrOutcome.String(OutcomeReleased)),
		heldLost:     with(AttrOutcome.String(OutcomeLost)),
		lostRefused:  with(AttrLostReason.String(LostRefused)),
		lostDeadline: with(AttrLostReason.String(LostDeadline)),
	}
	o.tables[k] = t
	return t
}

// measure returns the measurement options: cached unless extra attributes
// are given or cached is empty (an outcome or error type not cached), in
// which case the set is built from the table, extra and kvs.
func (t *attrTable) measure(cached mopts, extra []attribute.KeyValue, kvs ...attribute.KeyValue) mopts {
	if cached.rec != nil && len(extra) == 0 {
		return cached
	}
	all := make([]attribute.KeyValue, 0, len(extra)+len(t.base)+len(kvs))
	all = append(all, extra...)
	all = append(all, t.base...)
	all = append(all, kvs...)
	return newMopts(all...)
}

func modeOf(m core.Mode) string {
	switch m {
	case core.ModeTry:
		return ModeTry
	case core.ModeWait:
		return ModeWait
	}
	return string(m)
}

// keyAttr returns the span attribute for key per WithKeyMode.
func (o *Observer) keyAttr(key string) (attribute.KeyValue, bool) {
	switch o.keyMode {
	case KeyRaw:
		return AttrKey.String(key), true
	case KeyHashed:
		sum := sha256.Sum256([]byte(key))
		return AttrKeySHA256.String(hex.EncodeToString(sum[:])), true
	}
	return attribute.KeyValue{}, false
}

// spanAttrs returns the attributes a session's spans start with; st may
// be nil when the session's mode is unknown.
func (o *Observer) spanAttrs(backend string, st *sessionCtx, key string, token uint64, more int) []attribute.KeyValue {
	kvs := make([]attribute.KeyValue, 0, len(o.attrs)+5+more)
	kvs = append(kvs, o.attrs...)
	kvs = append(kvs, AttrBackend.String(BackendName(backend)))
	if st != nil {
		kvs = append(kvs, AttrMode.String(st.tab.mode), AttrSlot.Bool(st.tab.slot))
	}
	if kv, ok := o.keyAttr(key); ok {
		kvs = append(kvs, kv)
	}
	if token != 0 {
		kvs = append(kvs, AttrToken.String(tokenString(token)))
	}
	return kvs
}

func tokenString(t uint64) string { return strconv.FormatUint(t, 10) }
