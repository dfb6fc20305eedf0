// Package mirror keeps the subscriber's authoritative copy of one engine
// rank's cached blocks, and turns decoded engine events into the compact
// events forwarded to the index.
//
// A block is identified by (tier, LoRA, group, hash) and reference counted:
// vLLM does not de-duplicate identical full blocks, so the same hash can be
// stored twice and removed twice. Only the engine's prefix groups are kept
// (full attention and the like): a sliding-window group does not describe
// a contiguous prefix. A removal of a block the mirror does not hold (cached
// before the subscriber joined, or removed twice) is dropped and counted, so
// the index, fed only what the mirror forwards, holds exactly the mirror.
package mirror

import (
	"github.com/inferencecache/operator/internal/kvevent/wire"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// TierOf maps an engine medium onto the contract's tier: vLLM "GPU" (or no
// medium: older engines only had the GPU prefix cache) is GPU; "CPU" and
// SGLang "CPU_PINNED" are CPU; "STORAGE", "DISK", "EXTERNAL" and any other
// medium are DISK.
func TierOf(medium string) pb.Tier {
	switch medium {
	case "GPU", "":
		return pb.Tier_TIER_GPU
	case "CPU", "CPU_PINNED":
		return pb.Tier_TIER_CPU
	}
	return pb.Tier_TIER_DISK
}

// PrefixGroup reports whether a KV-cache spec kind describes a contiguous
// prefix; events without a kind (engines before hybrid groups) do.
func PrefixGroup(kind string) bool {
	switch kind {
	case "", "full_attention", "mla_attention", "sink_full_attention":
		return true
	}
	return false
}

// Key identifies one cached block in a rank.
type Key struct {
	Hash  uint64
	Tier  pb.Tier
	Lora  uint16 // index into the mirror's LoRA names; 0 is the base model
	Group uint16
}

// Stats counts what Apply saw.
type Stats struct {
	Stored, Removed, Cleared uint64 // block events applied
	UnknownRemovals          uint64 // removals of blocks the mirror did not hold
	SkippedGroups            uint64 // block events of non-prefix groups
}

// Mirror is one rank's cached blocks. It is not safe for concurrent use.
type Mirror struct {
	blocks map[Key]uint32
	loras  []string
	loraID map[string]uint16
	Stats  Stats
}

// New returns an empty mirror.
func New() *Mirror {
	return &Mirror{blocks: map[Key]uint32{}, loras: []string{""}, loraID: map[string]uint16{"": 0}}
}

// Len is the number of distinct blocks held.
func (m *Mirror) Len() int { return len(m.blocks) }

// Reset drops every block (a new publisher epoch).
func (m *Mirror) Reset() { clear(m.blocks) }

func (m *Mirror) lora(name string) uint16 {
	if name == "" {
		return 0
	}
	if id, ok := m.loraID[name]; ok {
		return id
	}
	if len(m.loras) >= 1<<16-1 {
		return 0
	}
	id := uint16(len(m.loras))
	m.loras = append(m.loras, name)
	m.loraID[name] = id
	return id
}

// Apply applies one batch's events in order and appends the events to
// forward to out (nil to forward nothing). Stored events are forwarded
// without token IDs unless withTokens.
func (m *Mirror) Apply(events []wire.Event, withTokens bool, out []*pb.BlockEvent) []*pb.BlockEvent {
	for i := range events {
		e := &events[i]
		switch e.Kind {
		case wire.AllBlocksCleared:
			clear(m.blocks)
			m.Stats.Cleared++
			if out != nil {
				out = append(out, &pb.BlockEvent{Event: &pb.BlockEvent_Cleared{Cleared: &pb.AllBlocksCleared{}}})
			}
		case wire.BlockStored:
			if !PrefixGroup(e.SpecKind) {
				m.Stats.SkippedGroups += uint64(len(e.Hashes))
				continue
			}
			k := Key{Tier: TierOf(e.Medium), Lora: m.lora(e.LoraName), Group: uint16(e.Group)}
			for _, h := range e.Hashes {
				k.Hash = h
				m.blocks[k]++
			}
			m.Stats.Stored += uint64(len(e.Hashes))
			if out != nil {
				s := &pb.BlockStored{BlockHashes: append([]uint64(nil), e.Hashes...), Tier: k.Tier, LoraName: e.LoraName,
					BlockSize: uint32(e.BlockSize), Group: uint32(e.Group)}
				if e.HasParent {
					p := e.Parent
					s.ParentBlockHash = &p
				}
				if withTokens {
					s.TokenIds = append([]uint32(nil), e.Tokens...)
				}
				out = append(out, &pb.BlockEvent{Event: &pb.BlockEvent_Stored{Stored: s}})
			}
		case wire.BlockRemoved:
			if !PrefixGroup(e.SpecKind) {
				m.Stats.SkippedGroups += uint64(len(e.Hashes))
				continue
			}
			k := Key{Tier: TierOf(e.Medium), Lora: m.lora(e.LoraName), Group: uint16(e.Group)}
			// Consecutive removals of one tier, LoRA and group (the block
			// pool emits one event per block) become one forwarded event.
			var held []uint64
			var merge *pb.BlockRemoved
			if n := len(out); n > 0 {
				if r, ok := out[n-1].Event.(*pb.BlockEvent_Removed); ok && r.Removed.Tier == k.Tier &&
					r.Removed.LoraName == e.LoraName && r.Removed.Group == uint32(e.Group) {
					merge, held = r.Removed, r.Removed.BlockHashes
				}
			}
			for _, h := range e.Hashes {
				k.Hash = h
				n, ok := m.blocks[k]
				if !ok {
					m.Stats.UnknownRemovals++
					continue
				}
				if n <= 1 {
					delete(m.blocks, k)
				} else {
					m.blocks[k] = n - 1
				}
				m.Stats.Removed++
				if out != nil {
					held = append(held, h)
				}
			}
			if merge != nil {
				merge.BlockHashes = held
			} else if len(held) > 0 {
				out = append(out, &pb.BlockEvent{Event: &pb.BlockEvent_Removed{Removed: &pb.BlockRemoved{
					BlockHashes: held, Tier: k.Tier, LoraName: e.LoraName, Group: uint32(e.Group)}}})
			}
		}
	}
	return out
}

// Entry is one held block with its reference count.
type Entry struct {
	Key
	LoraName string
	Refs     uint32
}

// Snapshot calls fn for every held block, in no particular order.
func (m *Mirror) Snapshot(fn func(Entry)) {
	for k, n := range m.blocks {
		fn(Entry{Key: k, LoraName: m.loras[k.Lora], Refs: n})
	}
}

// Has reports the reference count of a block.
func (m *Mirror) Has(k Key) uint32 { return m.blocks[k] }

// Chunks renders the mirror as snapshot chunks for one (rank, epoch), each
// with at most maxPerChunk hashes. Refcounts of blocks that differ only by
// group are summed: the contract's snapshot has no group.
func (m *Mirror) Chunks(rank uint32, epoch uint64, maxPerChunk int) (chunks []*pb.SnapshotChunk, count uint64) {
	type tl struct {
		tier pb.Tier
		lora uint16
	}
	merged := map[tl]map[uint64]uint32{}
	for k, n := range m.blocks {
		g := tl{k.Tier, k.Lora}
		if merged[g] == nil {
			merged[g] = map[uint64]uint32{}
		}
		merged[g][k.Hash] += n
	}
	cur := &pb.SnapshotChunk{Rank: rank, Epoch: epoch}
	size := 0
	for g, hs := range merged {
		ent := &pb.SnapshotEntries{Tier: g.tier, LoraName: m.loras[g.lora]}
		allOne := true
		for h, n := range hs {
			if size >= maxPerChunk {
				if len(ent.BlockHashes) > 0 {
					cur.Entries = append(cur.Entries, finish(ent, allOne))
				}
				chunks = append(chunks, cur)
				cur, size = &pb.SnapshotChunk{Rank: rank, Epoch: epoch}, 0
				ent, allOne = &pb.SnapshotEntries{Tier: g.tier, LoraName: m.loras[g.lora]}, true
			}
			ent.BlockHashes = append(ent.BlockHashes, h)
			ent.RefCounts = append(ent.RefCounts, n)
			allOne = allOne && n == 1
			size++
			count++
		}
		if len(ent.BlockHashes) > 0 {
			cur.Entries = append(cur.Entries, finish(ent, allOne))
		}
	}
	if len(cur.Entries) > 0 {
		chunks = append(chunks, cur)
	}
	return chunks, count
}

func finish(e *pb.SnapshotEntries, allOne bool) *pb.SnapshotEntries {
	if allOne {
		e.RefCounts = nil
	}
	return e
}
