// Package indexmetrics is the index's Prometheus metrics: an
// kvindex.Observer for the ingest and query events and a kvindex.Store
// decorator for what is measured of a store call (apply duration,
// evictions).
package indexmetrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inferencecache/operator/internal/kvindex"
)

// Metrics are the index's Prometheus metrics. A *Metrics is a
// kvindex.Observer; Store instruments a store.
type Metrics struct {
	deltas        *prometheus.CounterVec
	blockEvents   prometheus.Counter
	resyncs       *prometheus.CounterVec
	snapshots     prometheus.Counter
	evictions     *prometheus.CounterVec
	refused       *prometheus.CounterVec
	overLimit     *prometheus.CounterVec
	helloRefused  *prometheus.CounterVec
	disagrees     *prometheus.CounterVec
	streams       prometheus.Gauge
	applyDuration prometheus.Histogram
	scoreDuration prometheus.Histogram
}

var _ kvindex.Observer = (*Metrics)(nil)

// New creates the metrics and registers them with reg (nil: not
// registered, for tests).
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		deltas: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inferencecache_index_deltas_total", Help: "Deltas received, by outcome (applied, duplicate, need_snapshot).",
		}, []string{"outcome"}),
		blockEvents: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "inferencecache_index_block_events_total", Help: "Block stores, removals and clears applied.",
		}),
		resyncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inferencecache_index_resyncs_total", Help: "Snapshots requested from subscribers, by reason.",
		}, []string{"reason"}),
		snapshots: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "inferencecache_index_snapshots_applied_total", Help: "Snapshots applied.",
		}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inferencecache_index_evictions_total", Help: "Pods whose blocks were removed, by reason.",
		}, []string{"reason"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inferencecache_index_refused_total", Help: "Calls refused by authentication or authorisation, by API (ingest, query).",
		}, []string{"api"}),
		overLimit: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inferencecache_index_limit_refusals_total", Help: "Deltas and snapshots refused because they would pass a block limit, by scope (pod, backend, namespace, spaces, staging, namespace-staging).",
		}, []string{"scope"}),
		helloRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inferencecache_index_hello_refusals_total", Help: "Subscriber Hellos refused by a cap or check of the index, by reason (ranks: over --max-ranks; unknown_backend: no such CacheBackend, with --require-backend).",
		}, []string{"reason"}),
		disagrees: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inferencecache_index_scheme_disagreements_total", Help: "Subscriber streams whose events disagree with the hash scheme their hello announced, by what (block_size); the pod is reported hash Mismatch until a hello announces its events' scheme.",
		}, []string{"what"}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "inferencecache_index_streams", Help: "Subscriber streams connected to this replica.",
		}),
		applyDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "inferencecache_index_apply_duration_seconds", Help: "Time to apply one delta in the store.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 10),
		}),
		scoreDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "inferencecache_index_score_duration_seconds", Help: "Time to answer one Score query.",
			Buckets: prometheus.ExponentialBuckets(1e-5, 4, 10),
		}),
	}
	if reg != nil {
		reg.MustRegister(m.deltas, m.blockEvents, m.resyncs, m.snapshots, m.evictions, m.refused, m.overLimit, m.helloRefused, m.disagrees, m.streams, m.applyDuration, m.scoreDuration)
	}
	return m
}

// OverLimit implements kvindex.Observer.
func (m *Metrics) OverLimit(scope kvindex.LimitScope) {
	m.overLimit.WithLabelValues(string(scope)).Inc()
}

// Delta implements kvindex.Observer.
func (m *Metrics) Delta(outcome kvindex.Outcome, blockEvents int) {
	m.deltas.WithLabelValues(outcome.String()).Inc()
	if outcome == kvindex.Applied {
		m.blockEvents.Add(float64(blockEvents))
	}
}

// Resync implements kvindex.Observer.
func (m *Metrics) Resync(reason string) { m.resyncs.WithLabelValues(reason).Inc() }

// SnapshotApplied implements kvindex.Observer.
func (m *Metrics) SnapshotApplied() { m.snapshots.Inc() }

// Refused implements kvindex.Observer.
func (m *Metrics) Refused(api string) { m.refused.WithLabelValues(api).Inc() }

// SchemeDisagrees implements kvindex.Observer.
func (m *Metrics) SchemeDisagrees(what string) { m.disagrees.WithLabelValues(what).Inc() }

// HelloRefused implements kvindex.Observer.
func (m *Metrics) HelloRefused(reason string) { m.helloRefused.WithLabelValues(reason).Inc() }

// StreamOpened implements kvindex.Observer.
func (m *Metrics) StreamOpened() { m.streams.Inc() }

// StreamClosed implements kvindex.Observer.
func (m *Metrics) StreamClosed() { m.streams.Dec() }

// Scored implements kvindex.Observer.
func (m *Metrics) Scored(d time.Duration) { m.scoreDuration.Observe(d.Seconds()) }

// Store returns s instrumented: the duration of each successful Apply and
// the pods each ExpireLeases removes (reason "lease").
func (m *Metrics) Store(s kvindex.Store) kvindex.Store {
	return &instrumented{Store: s, m: m}
}

type instrumented struct {
	kvindex.Store
	m *Metrics
}

func (s *instrumented) Apply(ctx context.Context, src kvindex.Source, d kvindex.Delta) (kvindex.Outcome, kvindex.Position, error) {
	start := time.Now()
	outcome, pos, err := s.Store.Apply(ctx, src, d)
	if err == nil {
		s.m.applyDuration.Observe(time.Since(start).Seconds())
	}
	return outcome, pos, err
}

func (s *instrumented) ExpireLeases(ctx context.Context, now time.Time) ([]kvindex.PodKey, error) {
	gone, err := s.Store.ExpireLeases(ctx, now)
	if len(gone) > 0 {
		s.m.evictions.WithLabelValues("lease").Add(float64(len(gone)))
	}
	return gone, err
}
