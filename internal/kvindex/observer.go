package kvindex

import "time"

// Observer hears the index's ingest and query events; the Prometheus
// metrics (internal/kvindex/indexmetrics) are one. The measurements of a
// Store call (apply duration, evictions) are not events of the Index: a
// Store decorator takes them. Implementations are safe for concurrent use.
type Observer interface {
	// Delta reports a delta's outcome and the block stores, removals and
	// clears it holds (events applied only when the outcome is Applied).
	Delta(outcome Outcome, blockEvents int)
	// Resync reports a snapshot asked of a subscriber, by reason (gap,
	// epoch_changed, unknown_rank, snapshot_invalid).
	Resync(reason string)
	// SnapshotApplied reports a snapshot applied.
	SnapshotApplied()
	// Refused reports a call refused by authentication or authorisation,
	// by API (ingest, query).
	Refused(api string)
	// HelloRefused reports a Hello refused by a cap or a check of the
	// index, by reason (ranks, unknown_backend).
	HelloRefused(reason string)
	// StreamOpened and StreamClosed report a subscriber stream registered
	// with and unregistered from this replica.
	StreamOpened()
	StreamClosed()
	// Scored reports the time one Score query took.
	Scored(d time.Duration)
	// OverLimit reports a delta or snapshot refused because it would pass
	// a block limit, by scope (pod, backend, namespace, spaces, staging,
	// namespace-staging).
	OverLimit(scope LimitScope)
	// SchemeDisagrees reports a pod whose events disagree with the hash
	// scheme its hello announced, by what (block_size: its GPU-tier
	// BlockStored events carry another block size).
	SchemeDisagrees(what string)
}

// NopObserver is the Observer of an Index given none.
type NopObserver struct{}

// Delta implements Observer.
func (NopObserver) Delta(Outcome, int) {}

// Resync implements Observer.
func (NopObserver) Resync(string) {}

// SnapshotApplied implements Observer.
func (NopObserver) SnapshotApplied() {}

// Refused implements Observer.
func (NopObserver) Refused(string) {}

// HelloRefused implements Observer.
func (NopObserver) HelloRefused(string) {}

// StreamOpened implements Observer.
func (NopObserver) StreamOpened() {}

// StreamClosed implements Observer.
func (NopObserver) StreamClosed() {}

// Scored implements Observer.
func (NopObserver) Scored(time.Duration) {}

// OverLimit implements Observer.
func (NopObserver) OverLimit(LimitScope) {}

// SchemeDisagrees implements Observer.
func (NopObserver) SchemeDisagrees(string) {}
