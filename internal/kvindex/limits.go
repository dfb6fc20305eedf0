package kvindex

import (
	"errors"
	"fmt"
)

// Limits bound the blocks a Store holds, counted as PodBlocks counts them:
// distinct (rank, space, hash) a pod holds in any tier. Zero is unlimited.
// A Store is given its Limits when it is made and enforces them in Apply
// and Replace, atomically with the change: a change that would pass one is
// refused whole with a *LimitError and the rank's state and position stay
// as they were.
//
// What a change may add is bounded before it is applied, not measured
// after: for a delta it is the hashes its store ops name (each could be a
// new block), for a snapshot the distinct (space, hash) of its entries.
// The rank's own blocks do not count as held when the change drops them
// first (a snapshot, or sequence 1 of a newer epoch). Backend and
// namespace counts are checked against the counts when the change begins,
// so concurrent changes of other pods may pass those two limits by at most
// what they add between them (the store holds no lock across backends).
type Limits struct {
	PodBlocks       uint64
	BackendBlocks   uint64
	NamespaceBlocks uint64
	// NamespaceSpaces bounds the block spaces (model, LoRA adapter and
	// hash scheme) the CacheBackends of one namespace hold together: a
	// change that stores into more new spaces than are left is refused
	// (scope ScopeSpaces). The memory store enforces it, where a space
	// is a structure of its own (about 700 bytes besides its blocks); in
	// Redis a space is only a part of its blocks' key names, bounded by
	// the block limits.
	NamespaceSpaces uint64
}

// LimitScope names the count a limit bounds; metrics and messages use it.
type LimitScope string

// Limit scopes.
const (
	ScopePod       LimitScope = "pod"
	ScopeBackend   LimitScope = "backend"
	ScopeNamespace LimitScope = "namespace"
	// ScopeSpaces is Limits.NamespaceSpaces.
	ScopeSpaces LimitScope = "spaces"
	// ScopeStaging is the index's budget for snapshot entries staged
	// before their ends, all streams together (Options.MaxStagedBlocks):
	// not a Store limit.
	ScopeStaging LimitScope = "staging"
	// ScopeNamespaceStaging is one namespace's share of the staging budget
	// (Options.MaxStagedBlocksPerNamespace): not a Store limit.
	ScopeNamespaceStaging LimitScope = "namespace-staging"
)

// ErrOverLimit marks a change refused because it would pass a Limit
// (ResourceExhausted on the ingest stream).
var ErrOverLimit = errors.New("over the index's block limit")

// LimitError is the refusal of a change that would pass a Limit. It
// matches ErrOverLimit with errors.Is.
type LimitError struct {
	Scope LimitScope
	Limit uint64
	// Held is what the scope holds without the rank's blocks the change
	// drops first; Adding is the most the change could add.
	Held, Adding uint64
}

func (e *LimitError) Error() string {
	if e.Scope == ScopeSpaces {
		return fmt.Sprintf("namespace space limit %d: %d spaces (model, LoRA, hash scheme) held, the change could add %d", e.Limit, e.Held, e.Adding)
	}
	return fmt.Sprintf("%s block limit %d: %d held, the change could add %d", e.Scope, e.Limit, e.Held, e.Adding)
}

// Is makes errors.Is(err, ErrOverLimit) hold.
func (e *LimitError) Is(target error) bool { return target == ErrOverLimit }

// Held is what each scope of a change holds (see LimitError.Held).
type Held struct {
	Pod, Backend, Namespace uint64
}

// Check returns the refusal of a change adding at most adding blocks to
// scopes holding held, or nil: the pod limit first, then backend, then
// namespace. A change that adds nothing passes (a scope held past a
// limit lowered since may still shrink).
func (l Limits) Check(held Held, adding uint64) error {
	if adding == 0 {
		return nil
	}
	for _, c := range [...]struct {
		scope LimitScope
		limit uint64
		held  uint64
	}{{ScopePod, l.PodBlocks, held.Pod}, {ScopeBackend, l.BackendBlocks, held.Backend}, {ScopeNamespace, l.NamespaceBlocks, held.Namespace}} {
		if c.limit > 0 && c.held+adding > c.limit {
			return &LimitError{Scope: c.scope, Limit: c.limit, Held: c.held, Adding: adding}
		}
	}
	return nil
}

// StoredSpaces lists the spaces of d's store ops of a real tier, as
// often as its ops name them: the spaces d could add.
func StoredSpaces(d Delta) []Space {
	var out []Space
	for _, op := range d.Ops {
		if op.Kind == OpStore && op.Tier != TierUnspecified && op.Tier < NumTiers && len(op.Hashes) > 0 {
			out = append(out, op.Space)
		}
	}
	return out
}

// StoredHashes is the most blocks d could add: the hashes of its store
// ops of a real tier.
func StoredHashes(d Delta) uint64 {
	var n uint64
	for _, op := range d.Ops {
		if op.Kind == OpStore && op.Tier != TierUnspecified && op.Tier < NumTiers {
			n += uint64(len(op.Hashes))
		}
	}
	return n
}
