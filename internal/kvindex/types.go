// Package kvindex is the KV-block index behind cmd/cache-index: it applies
// the deltas and snapshots that kvevent-subscribers stream (exactly once per
// pod, rank, epoch and sequence), keeps per-pod leases and participation
// state, and answers longest-prefix Score queries per CacheBackend.
//
// The state lives in a Store: MemStore (the default) or the Redis/Valkey
// store in ./redisstore. The Store applies each delta atomically together
// with its idempotency check, so several index replicas on one Redis agree.
package kvindex

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// BackendRef names a CacheBackend. Every piece of index state belongs to
// exactly one; a query for one backend never sees another's blocks.
type BackendRef struct {
	Namespace string
	Name      string
}

// String is "namespace/name".
func (b BackendRef) String() string { return b.Namespace + "/" + b.Name }

// Tier is where a block lives. The values match the contract's Tier enum.
type Tier uint8

// Tiers.
const (
	TierUnspecified Tier = 0
	TierGPU         Tier = 1
	TierCPU         Tier = 2
	TierDisk        Tier = 3
	// NumTiers bounds the Tier values (TierDisk+1): arrays indexed by tier
	// have this length.
	NumTiers = 4
)

// String is the tier's name as the HTTP API and metrics spell it.
func (t Tier) String() string {
	switch t {
	case TierGPU:
		return "GPU"
	case TierCPU:
		return "CPU"
	case TierDisk:
		return "DISK"
	}
	return "UNSPECIFIED"
}

// Space is a block-hash key space inside a backend: hashes of different
// models, adapters or hash schemes never meet.
type Space struct {
	Model  string
	Lora   string
	Scheme string
}

// Source is one data-parallel rank of one engine pod: the unit that
// sequences deltas.
type Source struct {
	Backend BackendRef
	PodUID  string
	Rank    uint32
}

// OpKind is the kind of a block event.
type OpKind uint8

// Op kinds.
const (
	OpStore OpKind = iota + 1
	OpRemove
	OpClear
)

// Op is one block event of a delta. Clear ignores Space and Hashes; a
// TierUnspecified clear drops every tier.
type Op struct {
	Kind   OpKind
	Tier   Tier
	Space  Space
	Hashes []uint64
}

// Delta is one sequenced change of a Source.
type Delta struct {
	Epoch    uint64
	Sequence uint64
	Ops      []Op
}

// Position is where a Source stands: the last applied sequence of its
// current epoch.
type Position struct {
	Epoch    uint64
	Sequence uint64
}

// Outcome is what Apply did with a delta.
type Outcome uint8

// Outcomes.
const (
	// Applied: the delta was the next one and is now part of the state.
	Applied Outcome = iota + 1
	// Duplicate: already applied (a resend after a reconnect); nothing
	// changed.
	Duplicate
	// NeedSnapshot: the delta cannot be applied on the state held (unknown
	// rank, skipped sequence, older or unannounced epoch); nothing changed.
	NeedSnapshot
)

// String names the outcome for logs and metrics.
func (o Outcome) String() string {
	switch o {
	case Applied:
		return "applied"
	case Duplicate:
		return "duplicate"
	case NeedSnapshot:
		return "need_snapshot"
	}
	return "unknown"
}

// Entry is one block of a snapshot with its reference count.
type Entry struct {
	Space Space
	Tier  Tier
	Hash  uint64
	Refs  uint32
}

// Match is one (pod, rank)'s longest prefix of a query, in blocks.
type Match struct {
	PodUID string
	Rank   uint32
	// Any: leading blocks each held in some tier.
	Any uint32
	// GPU, CPU, Disk: leading blocks all held in that tier.
	GPU, CPU, Disk uint32
	// GPUOrCPU: leading blocks each held in GPU or CPU.
	GPUOrCPU uint32
}

// PodRecord is what the index knows about one pod beyond its blocks. The
// Store keeps it so that every replica on a shared store reports the same
// participation.
type PodRecord struct {
	Backend   BackendRef `json:"-"`
	UID       string     `json:"uid"`
	Name      string     `json:"name"`
	Model     string     `json:"model"`
	Engine    string     `json:"engine,omitempty"`
	Scheme    string     `json:"scheme"`
	BlockSize uint32     `json:"blockSize"`
	// TierScheme is the scheme of the pod's tiers other than GPU when its
	// subscriber verified one (LMCache's blake3 chunks), "" otherwise;
	// ChunkSize its block size.
	TierScheme    string `json:"tierScheme,omitempty"`
	ChunkSize     uint32 `json:"chunkSize,omitempty"`
	Compatibility int32  `json:"compatibility"`
	// Address is the pod as routers name it (the Hello's worker_address),
	// "" when the subscriber sent none.
	Address       string       `json:"address,omitempty"`
	DPSize        uint32       `json:"dpSize"`
	LastSeen      time.Time    `json:"lastSeen"`
	LastEvent     time.Time    `json:"lastEvent,omitzero"`
	Resyncs       uint64       `json:"resyncs"`
	AwaitSnapshot []uint32     `json:"awaitSnapshot,omitempty"`
	Ranks         []RankHealth `json:"ranks,omitempty"`
}

// RankHealth is the subscriber's report of one rank (from its heartbeat).
type RankHealth struct {
	Rank          uint32 `json:"rank"`
	State         int32  `json:"state"`
	EventsTotal   uint64 `json:"eventsTotal"`
	Gaps          uint64 `json:"gaps"`
	GapsRecovered uint64 `json:"gapsRecovered"`
	LagP50Millis  uint32 `json:"lagP50Millis"`
	LagP99Millis  uint32 `json:"lagP99Millis"`
	Message       string `json:"message,omitempty"`
}

// PodKey names a pod in the index.
type PodKey struct {
	Backend BackendRef
	UID     string
}

// Store holds the index state. Implementations are safe for concurrent use
// and apply every mutation atomically.
type Store interface {
	// Apply applies d to src exactly once: only if d.Sequence follows the
	// applied position of d.Epoch, or d is sequence 1 of an epoch newer
	// than the one held (a publisher restart: the rank's blocks are
	// dropped first). It returns the position after the call. A delta
	// that would pass the store's Limits is refused with a *LimitError
	// (ErrOverLimit) and changes nothing.
	Apply(ctx context.Context, src Source, d Delta) (Outcome, Position, error)
	// Replace swaps the rank's blocks for the snapshot's entries and sets
	// its position, atomically. A snapshot that would pass the store's
	// Limits is refused with a *LimitError (ErrOverLimit) and changes
	// nothing.
	Replace(ctx context.Context, src Source, pos Position, snap *Snapshot) error
	// Positions returns the applied position of each rank of a pod that
	// the store knows.
	Positions(ctx context.Context, pod PodKey) (map[uint32]Position, error)
	// Score returns the longest-prefix match of hashes (in prompt order) for
	// every (pod, rank) of the backend holding at least the first block.
	Score(ctx context.Context, backend BackendRef, space Space, hashes []uint64) ([]Match, error)
	// TierBlocks counts block residencies per tier in a backend.
	TierBlocks(ctx context.Context, backend BackendRef) ([NumTiers]uint64, error)
	// PodBlocks counts the blocks (any tier) a pod holds.
	PodBlocks(ctx context.Context, pod PodKey) (uint64, error)
	// PutPod stores a pod's record and extends its lease to leaseUntil.
	PutPod(ctx context.Context, rec PodRecord, leaseUntil time.Time) error
	// Pods lists the records of a backend's pods.
	Pods(ctx context.Context, backend BackendRef) ([]PodRecord, error)
	// ExpireLeases removes every pod whose lease ended before now: its
	// blocks, positions and record, and a backend's own state (its
	// spaces, counters, its place in the reaper's list) with its last pod.
	// It returns the pods removed.
	ExpireLeases(ctx context.Context, now time.Time) ([]PodKey, error)
	// Close releases the store's resources.
	Close() error
}

// ErrStaleEpoch is returned for a snapshot of an epoch older than the one
// the store holds for that rank.
var ErrStaleEpoch = errors.New("snapshot epoch is older than the applied epoch")

// SpaceKey is the stable text form of a space, used in store keys.
func SpaceKey(s Space) string { return fmt.Sprintf("%s\x00%s\x00%s", s.Model, s.Lora, s.Scheme) }
