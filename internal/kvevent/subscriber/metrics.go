package subscriber

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the subscriber's Prometheus metrics (labels: rank; the pod
// comes from the scrape's target labels).
type Metrics struct {
	Batches       *prometheus.CounterVec   // rank, source=live|replay
	Events        *prometheus.CounterVec   // rank, type
	Gaps          *prometheus.CounterVec   // rank
	Replays       *prometheus.CounterVec   // rank, result=ok|partial|expired|timeout|error
	Epochs        *prometheus.CounterVec   // rank
	DecodeErrors  *prometheus.CounterVec   // rank, reason
	Dropped       *prometheus.CounterVec   // stage=receive|forward|replica|frame|stale
	LastSequence  *prometheus.GaugeVec     // rank
	Lag           *prometheus.HistogramVec // rank
	MirrorBlocks  *prometheus.GaugeVec     // rank
	HashVerify    *prometheus.CounterVec   // result
	TierVerify    *prometheus.CounterVec   // result
	JournalDepth  prometheus.Gauge
	Snapshots     *prometheus.CounterVec // reason
	Connected     prometheus.Gauge       // replicas with an open stream
	Targets       prometheus.Gauge       // index replicas forwarded to
	UnknownRemove *prometheus.CounterVec // rank
	BlockSize     *prometheus.GaugeVec   // rank
}

// NewMetrics registers the metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const ns = "inferencecache_kvevents"
	m := &Metrics{
		Batches: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "batches_total",
			Help: "Engine event batches applied, by source (live stream or replay)."}, []string{"rank", "source"}),
		Events: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "events_total",
			Help: "Block events applied to the mirror (one per block hash; clears count once)."}, []string{"rank", "type"}),
		Gaps: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "sequence_gaps_total",
			Help: "Gaps in the engine's batch sequence (late join included)."}, []string{"rank"}),
		Replays: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "replay_requests_total",
			Help: "Replay requests to the engine's ROUTER socket, by result."}, []string{"rank", "result"}),
		Epochs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "epoch_resets_total",
			Help: "New epochs: publisher restarts and unrecoverable gaps."}, []string{"rank"}),
		DecodeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "decode_errors_total",
			Help: "Batches dropped because they did not decode, by reason."}, []string{"rank", "reason"}),
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "dropped_total",
			Help: "Messages dropped: receive (processing queue full), forward (forwarder queue full), replica (one index replica's queue full), frame (malformed ZMQ message), stale (a replayed batch already applied)."}, []string{"stage"}),
		LastSequence: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "last_sequence",
			Help: "The last engine batch sequence applied."}, []string{"rank"}),
		Lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "event_lag_seconds",
			Help:    "Time from the engine's batch timestamp to its application in the mirror.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}}, []string{"rank"}),
		MirrorBlocks: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "mirror_blocks",
			Help: "Distinct blocks in the mirror of the engine's cache."}, []string{"rank"}),
		HashVerify: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "hash_verify_total",
			Help: "BlockStored events whose hashes were recomputed, by result."}, []string{"result"}),
		TierVerify: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "tier_hash_verify_total",
			Help: "BlockStored events of tiers other than GPU (LMCache's CPU chunks) whose hashes were recomputed as LMCache's blake3 chunk hashes, by result."}, []string{"result"}),
		JournalDepth: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "forward_journal_depth",
			Help: "Deltas sent to the index and not yet acknowledged."}),
		Snapshots: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "forward_snapshots_total",
			Help: "Full snapshots sent to the index, by reason."}, []string{"reason"}),
		Connected: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "forward_connected",
			Help: "Index replicas with an open stream from this subscriber (0 or 1 for a single address)."}),
		Targets: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "forward_targets",
			Help: "Index replica addresses the index's name resolves to, each with its own forwarder."}),
		UnknownRemove: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "unknown_removals_total",
			Help: "BlockRemoved hashes the mirror did not hold (cached before the subscriber joined)."}, []string{"rank"}),
		BlockSize: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "block_size",
			Help: "Tokens per block of the engine's own BlockStored events (what the hash scheme announces to the index); 0 before the first."}, []string{"rank"}),
	}
	reg.MustRegister(m.Batches, m.Events, m.Gaps, m.Replays, m.Epochs, m.DecodeErrors, m.Dropped, m.LastSequence,
		m.Lag, m.MirrorBlocks, m.HashVerify, m.TierVerify, m.JournalDepth, m.Snapshots, m.Connected, m.Targets, m.UnknownRemove, m.BlockSize)
	return m
}
