package kvindex

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the index's Prometheus metrics.
type Metrics struct {
	deltas        *prometheus.CounterVec
	blockEvents   prometheus.Counter
	resyncs       *prometheus.CounterVec
	snapshots     prometheus.Counter
	evictions     *prometheus.CounterVec
	refused       *prometheus.CounterVec
	streams       prometheus.Gauge
	applyDuration prometheus.Histogram
	scoreDuration prometheus.Histogram
}

// NewMetrics creates the metrics and registers them with reg (nil: not
// registered, for tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
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
		reg.MustRegister(m.deltas, m.blockEvents, m.resyncs, m.snapshots, m.evictions, m.refused, m.streams, m.applyDuration, m.scoreDuration)
	}
	return m
}
