package memstore

import "github.com/inferencecache/operator/internal/kvindex"

// Residency is the tiers one (pod, rank) holds one block in, as a store
// whose state lives elsewhere reports it: the Redis store's read model
// mirrors its placements here, so that Score walks memory instead of
// asking Redis once per block.
type Residency struct {
	Space kvindex.Space
	Hash  uint64
	// Mask has kvindex.TierBit(t) set for each tier t the block is held
	// in; 0: not held.
	Mask uint8
}

// SetResidencies sets the tiers in which (uid, rank) of backend holds
// each block of rs, a later entry for a block overriding an earlier one.
// A mirrored block counts one reference per tier; positions, limits and
// pod records are the source store's, not kept here. A (pod, rank) left
// without blocks is forgotten, and a backend with its last one.
func (s *Store) SetResidencies(backend kvindex.BackendRef, uid string, rank uint32, rs []Residency) {
	b := s.lockBackend(backend)
	defer b.mu.Unlock()
	id, exists := b.instance(uid, rank, false)
	for _, r := range rs {
		mask := r.Mask & (kvindex.TierBit(kvindex.TierGPU) | kvindex.TierBit(kvindex.TierCPU) | kvindex.TierBit(kvindex.TierDisk))
		sp := b.space(r.Space, mask != 0)
		if sp == nil {
			continue // removing from a space nothing holds
		}
		if !exists {
			if mask == 0 {
				continue
			}
			id, exists = b.instance(uid, rank, true)
		}
		w, _, _ := sp.find(r.Hash, id)
		for t := kvindex.TierGPU; t <= kvindex.TierDisk; t++ {
			switch want, has := mask&kvindex.TierBit(t) != 0, resRefs(w, t) != 0; {
			case want && !has:
				b.add(sp, id, r.Hash, t, 1)
			case !want && has:
				for range resRefs(w, t) {
					b.remove(sp, id, r.Hash, t)
				}
			}
		}
		b.dropIfEmpty(sp)
	}
	if exists && b.insts[id].blocks == 0 {
		b.dropInstance(id)
		if p := b.pods[uid]; p != nil {
			delete(p.ranks, rank)
			if len(p.ranks) == 0 {
				delete(b.pods, uid)
			}
		}
	}
	if len(b.pods) == 0 {
		s.drop(backend, b)
	}
}

// DropBackend forgets everything the store holds for backend.
func (s *Store) DropBackend(backend kvindex.BackendRef) {
	b := s.backend(backend, false)
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	s.drop(backend, b)
}
