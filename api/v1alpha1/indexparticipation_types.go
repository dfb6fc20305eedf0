package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// MaxIndexParticipationPods bounds status.indexParticipation.pods: the
// worst pods first, so that a backend of any size keeps a small status.
const MaxIndexParticipationPods = 10

// IndexPodState is an engine pod's participation state in the KV-block
// index.
// +kubebuilder:validation:Enum=Missing;Connecting;Replaying;Live;Stale;Unsynced
type IndexPodState string

// Index pod states, worst first.
const (
	// IndexPodMissing: the pod is wired for KV events but the index has
	// never heard of its subscriber.
	IndexPodMissing IndexPodState = "Missing"
	// IndexPodUnsynced: the subscriber lost events it cannot recover; the
	// pod's blocks are not used for scoring.
	IndexPodUnsynced IndexPodState = "Unsynced"
	// IndexPodStale: the subscriber sent nothing (not even a heartbeat)
	// for the index's stale period.
	IndexPodStale IndexPodState = "Stale"
	// IndexPodReplaying: the subscriber catches up (engine replay or a
	// snapshot).
	IndexPodReplaying IndexPodState = "Replaying"
	// IndexPodConnecting: the subscriber said hello; no rank is in sync yet.
	IndexPodConnecting IndexPodState = "Connecting"
	// IndexPodLive: every rank streams in order.
	IndexPodLive IndexPodState = "Live"
)

// HashCompatibility says whether the index can hash a router's token IDs
// the way the engines do.
// +kubebuilder:validation:Enum=Verified;Mismatch;Unverifiable
type HashCompatibility string

// Hash compatibilities.
const (
	// HashVerified: the subscriber recomputed the engine's block hashes and
	// they matched.
	HashVerified HashCompatibility = "Verified"
	// HashMismatch: the recomputed hashes differ (seed, block size or
	// algorithm): token-ID queries would never match.
	HashMismatch HashCompatibility = "Mismatch"
	// HashUnverifiable: the scheme cannot be reproduced; only block-hash
	// queries work.
	HashUnverifiable HashCompatibility = "Unverifiable"
)

// IndexParticipation is the KV-block index's view of the backend's engine
// pods, as the operator last read it. Set only while spec.observation is
// set. Rates and times are refreshed when something else changes or they
// moved by more than the change thresholds documented in
// docs/design/cachebackend-api.md, never on jitter alone.
type IndexParticipation struct {
	// Indexed is "<live>/<expected>", the Indexed printer column.
	// +kubebuilder:validation:MaxLength=24
	// +optional
	Indexed string `json:"indexed,omitempty"`

	// ExpectedPods counts the matched engine pods wired with the
	// kvevent-subscriber sidecar (the pods the index should know).
	// +optional
	ExpectedPods int32 `json:"expectedPods"`
	// LivePods counts expected pods streaming in order.
	// +optional
	LivePods int32 `json:"livePods"`
	// ResyncingPods counts expected pods connecting or catching up
	// (replay or snapshot).
	// +optional
	ResyncingPods int32 `json:"resyncingPods"`
	// StalePods counts expected pods whose subscriber went silent.
	// +optional
	StalePods int32 `json:"stalePods"`
	// UnsyncedPods counts expected pods whose blocks are not trusted.
	// +optional
	UnsyncedPods int32 `json:"unsyncedPods"`
	// MissingPods counts expected pods the index has never heard of.
	// +optional
	MissingPods int32 `json:"missingPods"`

	// Blocks counts indexed block residencies per tier.
	// +optional
	Blocks IndexBlocks `json:"blocks"`

	// EventsPerMinute is the rate of applied block events over the last
	// minute, rounded. Not part of the change test: it alone never causes a
	// status write.
	// +optional
	EventsPerMinute int64 `json:"eventsPerMinute,omitempty"`
	// LagP50Millis and LagP99Millis are the worst subscriber-reported lags
	// from engine timestamp to forwarding, over ranks.
	// +optional
	LagP50Millis int64 `json:"lagP50Millis,omitempty"`
	// +optional
	LagP99Millis int64 `json:"lagP99Millis,omitempty"`
	// SequenceGaps counts batches the subscribers missed; GapsRecovered
	// those the engine's replay filled.
	// +optional
	SequenceGaps int64 `json:"sequenceGaps,omitempty"`
	// +optional
	GapsRecovered int64 `json:"gapsRecovered,omitempty"`
	// Resyncs counts snapshots the index needed.
	// +optional
	Resyncs int64 `json:"resyncs,omitempty"`

	// HashScheme is the engines' block-hash scheme as the index reports it,
	// e.g. sha256_cbor/16/vllm-none-hash ("mixed" when pods differ).
	// +kubebuilder:validation:MaxLength=128
	// +optional
	HashScheme string `json:"hashScheme,omitempty"`
	// HashCompatibility is the worst over the pods.
	// +optional
	HashCompatibility HashCompatibility `json:"hashCompatibility,omitempty"`
	// TierScheme is the scheme of the engines' other tiers when their
	// sidecars verified one: LMCache's CPU chunks in multiprocess mode,
	// e.g. lmcache_blake3/256/ (the chunk size the server really uses;
	// "mixed" when pods differ). Token queries are scored in it too.
	// Empty: the other tiers, if any, are in HashScheme's.
	// +kubebuilder:validation:MaxLength=128
	// +optional
	TierScheme string `json:"tierScheme,omitempty"`

	// LastEventTime is when the index last applied a block event of the
	// backend.
	// +optional
	LastEventTime *metav1.Time `json:"lastEventTime,omitempty"`

	// Pods lists the worst pods first (missing, unsynced, stale, replaying,
	// connecting, live; then by lag), at most 10.
	// +kubebuilder:validation:MaxItems=10
	// +listType=map
	// +listMapKey=name
	// +optional
	Pods []PodIndexParticipation `json:"pods,omitempty"`
	// PodsTruncated is true when more pods exist than Pods lists.
	// +optional
	PodsTruncated bool `json:"podsTruncated,omitempty"`
}

// IndexBlocks counts block residencies per tier.
type IndexBlocks struct {
	// +optional
	GPU int64 `json:"gpu"`
	// +optional
	CPU int64 `json:"cpu"`
	// +optional
	Disk int64 `json:"disk"`
}

// PodIndexParticipation is one engine pod's line.
type PodIndexParticipation struct {
	// Name is the pod's name.
	// +kubebuilder:validation:MaxLength=253
	// +required
	Name string `json:"name"`
	// State is the pod's participation state.
	// +required
	State IndexPodState `json:"state"`
	// Blocks counts the blocks the pod holds (any tier).
	// +optional
	Blocks int64 `json:"blocks,omitempty"`
	// LagMillis is the pod's worst p99 lag over its ranks.
	// +optional
	LagMillis int64 `json:"lagMillis,omitempty"`
	// SequenceGaps counts batches the pod's subscriber missed.
	// +optional
	SequenceGaps int64 `json:"sequenceGaps,omitempty"`
	// Resyncs counts snapshots the index needed from the pod.
	// +optional
	Resyncs int64 `json:"resyncs,omitempty"`
	// HashCompatibility of the pod's block hashes.
	// +optional
	HashCompatibility HashCompatibility `json:"hashCompatibility,omitempty"`
	// LastEventTime is when the index last applied an event of the pod.
	// +optional
	LastEventTime *metav1.Time `json:"lastEventTime,omitempty"`
	// Message explains a state that is not Live.
	// +kubebuilder:validation:MaxLength=256
	// +optional
	Message string `json:"message,omitempty"`
}
