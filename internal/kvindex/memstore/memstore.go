// Package memstore is the in-memory kvindex.Store: the default, for one
// index replica (the Redis store in ../redisstore is for several).
package memstore

import (
	"context"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inferencecache/operator/internal/kvindex"
)

// Store is the in-memory kvindex.Store. Memory per block residency is a few
// words: a block hash maps to one 64-bit posting word when one (pod, rank)
// holds it (the instance id and a 10-bit reference count per tier packed
// together), or to a slot of a shared slab when several do; each instance
// keeps an append-only log of its hashes (compacted as it grows) so that
// dropping a pod costs its own blocks, never a scan of the index. There is
// no heap object per block.
type Store struct {
	limits kvindex.Limits

	mu       sync.RWMutex
	backends map[kvindex.BackendRef]*memBackend
	// namespaces counts each namespace's blocks (the backends' sums); an
	// entry lives while a backend of the namespace does.
	namespaces map[string]*nsCount
}

type nsCount struct {
	blocks atomic.Int64
	// spaces counts the block spaces of the namespace's backends: a space
	// lives while it holds a block (dropIfEmpty).
	spaces   atomic.Int64
	backends int // under Store.mu
}

// New returns an empty in-memory store without limits.
func New() *Store { return NewLimited(kvindex.Limits{}) }

// NewLimited returns an empty in-memory store that refuses changes past
// limits (see kvindex.Limits).
func NewLimited(limits kvindex.Limits) *Store {
	return &Store{limits: limits, backends: map[kvindex.BackendRef]*memBackend{}, namespaces: map[string]*nsCount{}}
}

var _ kvindex.Store = (*Store)(nil)

type instKey struct {
	uid  string
	rank uint32
}

type memInstance struct {
	used   bool
	uid    string
	rank   uint32
	known  bool
	pos    kvindex.Position
	blocks uint64
	logs   map[*memSpace][]uint64
}

type memPod struct {
	rec        kvindex.PodRecord
	leaseUntil time.Time
	ranks      map[uint32]uint32
}

type memBackend struct {
	mu sync.RWMutex
	// dead: ExpireLeases removed this backend with its last pod; a caller
	// that looked it up before takes a new one (lockBackend).
	dead   bool
	ns     *nsCount
	blocks uint64 // the pods' blocks summed (PodBlocks of each)
	insts  []memInstance
	byKey  map[instKey]uint32
	free   []uint32
	spaces map[kvindex.Space]*memSpace
	pods   map[string]*memPod
	tiers  [kvindex.NumTiers]uint64
}

type memSpace struct {
	key    kvindex.Space
	blocks map[uint64]uint64
	multi  [][]uint64
	// dense[i], for a posting of many residents, holds the same residency
	// as bitsets over instance ids (GPU words, then CPU, then disk), so a
	// prefix walk ANDs words instead of visiting residents.
	dense     [][]uint64
	freeMulti []uint32
}

// denseMin is the posting size from which a bitset copy is kept (a list of
// 64 words costs more than the bitsets for ~1,000 instances).
const denseMin = 64

// Posting words. A resident word is inst<<32 | gpu<<20 | cpu<<10 | disk;
// a word with multiFlag set indexes memSpace.multi instead (its low 32
// bits), with denseFlag set when memSpace.dense holds a bitset copy, so that
// a walk reads the dense slab only for the postings that have one.
const (
	multiFlag = uint64(1) << 63
	denseFlag = uint64(1) << 62
	refBits   = 10
	refMax    = 1<<refBits - 1
)

var tierShift = [kvindex.NumTiers]uint{0, 20, 10, 0}

func resInst(w uint64) uint32 { return uint32(w >> 32) }

func resRefs(w uint64, t kvindex.Tier) uint32 { return uint32(w>>tierShift[t]) & refMax }

func resSetRefs(w uint64, t kvindex.Tier, n uint32) uint64 {
	return w&^(uint64(refMax)<<tierShift[t]) | uint64(n)<<tierShift[t]
}

func resMask(w uint64) uint8 {
	var m uint8
	for t := kvindex.TierGPU; t <= kvindex.TierDisk; t++ {
		if resRefs(w, t) != 0 {
			m |= kvindex.TierBit(t)
		}
	}
	return m
}

func (s *Store) backend(b kvindex.BackendRef, create bool) *memBackend {
	s.mu.RLock()
	mb := s.backends[b]
	s.mu.RUnlock()
	if mb != nil || !create {
		return mb
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if mb = s.backends[b]; mb == nil {
		ns := s.namespaces[b.Namespace]
		if ns == nil {
			ns = &nsCount{}
			s.namespaces[b.Namespace] = ns
		}
		ns.backends++
		mb = &memBackend{ns: ns, byKey: map[instKey]uint32{}, spaces: map[kvindex.Space]*memSpace{}, pods: map[string]*memPod{}}
		s.backends[b] = mb
	}
	return mb
}

// lockBackend returns backend b, created if need be, locked for writing.
func (s *Store) lockBackend(b kvindex.BackendRef) *memBackend {
	for {
		mb := s.backend(b, true)
		mb.mu.Lock()
		if !mb.dead {
			return mb
		}
		mb.mu.Unlock()
	}
}

// counted keeps the backend's and namespace's block counts with an
// instance's: n blocks gained (or lost, negative).
func (b *memBackend) counted(n int64) {
	b.blocks = uint64(int64(b.blocks) + n)
	b.ns.blocks.Add(n)
}

// held is what each limit scope holds for a change of instance id (if
// exists) of pod uid that drops the instance's blocks first when fresh.
func (b *memBackend) held(uid string, id uint32, exists, fresh bool) kvindex.Held {
	var h kvindex.Held
	if p := b.pods[uid]; p != nil {
		for _, i := range p.ranks {
			h.Pod += b.insts[i].blocks
		}
	}
	h.Backend = b.blocks
	h.Namespace = uint64(max(b.ns.blocks.Load(), 0))
	if exists && fresh {
		own := b.insts[id].blocks
		h.Pod -= own
		h.Backend -= own
		h.Namespace -= min(own, h.Namespace)
	}
	return h
}

func (b *memBackend) space(sp kvindex.Space, create bool) *memSpace {
	s := b.spaces[sp]
	if s == nil && create {
		s = &memSpace{key: sp, blocks: map[uint64]uint64{}}
		b.spaces[sp] = s
		b.ns.spaces.Add(1)
	}
	return s
}

// dropIfEmpty forgets space s once no instance holds a block of it, so
// that a backend keeps no space without blocks: a pod that stores and
// removes a block under ever new LoRA names made the index keep one
// empty space (about 700 bytes) per name before. Instances' logs of s
// hold only hashes no longer present; they go with it.
func (b *memBackend) dropIfEmpty(s *memSpace) {
	if s == nil || len(s.blocks) > 0 || b.spaces[s.key] != s {
		return
	}
	for i := range b.insts {
		delete(b.insts[i].logs, s)
	}
	delete(b.spaces, s.key)
	b.ns.spaces.Add(-1)
}

// checkSpaces refuses a change that would make the namespace hold more
// than limits.NamespaceSpaces spaces with the spaces it stores into.
func (s *Store) checkSpaces(b *memBackend, spaces []kvindex.Space) error {
	if s.limits.NamespaceSpaces == 0 {
		return nil
	}
	held := uint64(max(b.ns.spaces.Load(), 0))
	var adding uint64
	seen := map[kvindex.Space]bool{}
	for _, sp := range spaces {
		if b.spaces[sp] != nil || seen[sp] {
			continue
		}
		seen[sp] = true
		if adding++; held+adding > s.limits.NamespaceSpaces {
			return &kvindex.LimitError{Scope: kvindex.ScopeSpaces, Limit: s.limits.NamespaceSpaces, Held: held, Adding: adding}
		}
	}
	return nil
}

func (b *memBackend) instance(uid string, rank uint32, create bool) (uint32, bool) {
	if id, ok := b.byKey[instKey{uid, rank}]; ok {
		return id, true
	}
	if !create {
		return 0, false
	}
	var id uint32
	if n := len(b.free); n > 0 {
		id = b.free[n-1]
		b.free = b.free[:n-1]
	} else {
		id = uint32(len(b.insts))
		b.insts = append(b.insts, memInstance{})
	}
	b.insts[id] = memInstance{used: true, uid: uid, rank: rank, logs: map[*memSpace][]uint64{}}
	b.byKey[instKey{uid, rank}] = id
	p := b.pods[uid]
	if p == nil {
		p = &memPod{rec: kvindex.PodRecord{UID: uid}, ranks: map[uint32]uint32{}}
		b.pods[uid] = p
	}
	p.ranks[rank] = id
	return id, true
}

// find returns the index of inst's resident word in the posting of h: the
// word itself for an inline posting (slot -1), or its slot in the slab.
func (s *memSpace) find(h uint64, inst uint32) (word uint64, slot int, ok bool) {
	p, present := s.blocks[h]
	if !present {
		return 0, -1, false
	}
	if p&multiFlag == 0 {
		if resInst(p) == inst {
			return p, -1, true
		}
		return 0, -1, false
	}
	for i, w := range s.multi[uint32(p)] {
		if resInst(w) == inst {
			return w, i, true
		}
	}
	return 0, -1, false
}

// set writes inst's resident word for h; a word with no refs removes it.
func (s *memSpace) set(h uint64, inst uint32, slot int, w uint64) {
	empty := w&(1<<30-1) == 0
	p, present := s.blocks[h]
	switch {
	case !present:
		if !empty {
			s.blocks[h] = w
		}
	case p&multiFlag == 0:
		if resInst(p) == inst {
			if empty {
				delete(s.blocks, h)
			} else {
				s.blocks[h] = w
			}
			return
		}
		if empty {
			return
		}
		s.blocks[h] = multiFlag | uint64(s.newMulti(p, w))
	default:
		idx := uint32(p)
		list := s.multi[idx]
		switch {
		case slot >= 0 && empty:
			list[slot] = list[len(list)-1]
			list = list[:len(list)-1]
			if len(list) == 1 {
				s.blocks[h] = list[0]
				s.multi[idx] = nil
				s.dense[idx] = nil
				s.freeMulti = append(s.freeMulti, idx)
				return
			}
			s.multi[idx] = list
		case slot >= 0:
			list[slot] = w
		case !empty:
			s.multi[idx] = append(list, w)
		}
		if np := s.syncDense(idx, inst, w); np != p {
			s.blocks[h] = np
		}
	}
}

// syncDense keeps the bitset copy of a large posting after inst's word
// changed to w (no refs: removed); it returns the posting's map word.
func (s *memSpace) syncDense(idx, inst uint32, w uint64) uint64 {
	list, d := s.multi[idx], s.dense[idx]
	if d == nil {
		if len(list) < denseMin {
			return multiFlag | uint64(idx)
		}
		var top uint32
		for _, r := range list {
			top = max(top, resInst(r))
		}
		words := int(top)/64 + 1
		d = make([]uint64, 3*words)
		for _, r := range list {
			setDense(d, words, resInst(r), resMask(r))
		}
		s.dense[idx] = d
		return multiFlag | denseFlag | uint64(idx)
	}
	if len(list) < denseMin/2 {
		s.dense[idx] = nil
		return multiFlag | uint64(idx)
	}
	words := len(d) / 3
	if int(inst)/64 >= words {
		nw := int(inst)/64 + 1
		nd := make([]uint64, 3*nw)
		for t := range 3 {
			copy(nd[t*nw:], d[t*words:(t+1)*words])
		}
		d, words = nd, nw
		s.dense[idx] = d
	}
	var m uint8
	if w&(1<<30-1) != 0 {
		m = resMask(w)
	}
	setDense(d, words, inst, m)
	return multiFlag | denseFlag | uint64(idx)
}

func setDense(d []uint64, words int, inst uint32, mask uint8) {
	word, bit := int(inst)/64, uint64(1)<<(inst%64)
	for t := kvindex.TierGPU; t <= kvindex.TierDisk; t++ {
		i := int(t-1)*words + word
		if mask&kvindex.TierBit(t) != 0 {
			d[i] |= bit
		} else {
			d[i] &^= bit
		}
	}
}

func (s *memSpace) newMulti(a, b uint64) uint32 {
	list := make([]uint64, 2, 4)
	list[0], list[1] = a, b
	if n := len(s.freeMulti); n > 0 {
		idx := s.freeMulti[n-1]
		s.freeMulti = s.freeMulti[:n-1]
		s.multi[idx] = list
		return idx
	}
	s.multi = append(s.multi, list)
	s.dense = append(s.dense, nil)
	return uint32(len(s.multi) - 1)
}

// add adds n references of (h, tier) for inst.
func (b *memBackend) add(s *memSpace, id uint32, h uint64, t kvindex.Tier, n uint32) {
	w, slot, ok := s.find(h, id)
	in := &b.insts[id]
	old := resRefs(w, t)
	if old == 0 {
		b.tiers[t]++
	}
	if ok {
		s.set(h, id, slot, resSetRefs(w, t, min(old+n, refMax)))
		return
	}
	s.set(h, id, slot, resSetRefs(uint64(id)<<32, t, min(n, refMax)))
	in.blocks++
	b.counted(1)
	in.logs[s] = append(in.logs[s], h)
	if l := uint64(len(in.logs[s])); l > 64 && l > 2*in.blocks {
		b.compactLog(id, s)
	}
}

// remove drops one reference of (h, tier) for inst; unknown blocks are
// ignored (an eviction the index never saw stored).
func (b *memBackend) remove(s *memSpace, id uint32, h uint64, t kvindex.Tier) {
	w, slot, ok := s.find(h, id)
	if !ok {
		return
	}
	old := resRefs(w, t)
	if old == 0 {
		return
	}
	if old == 1 {
		b.tiers[t]--
	}
	w = resSetRefs(w, t, old-1)
	if resMask(w) == 0 {
		b.insts[id].blocks--
		b.counted(-1)
	}
	s.set(h, id, slot, w)
}

// clearInstance drops inst's blocks of one tier, or of every tier.
func (b *memBackend) clearInstance(id uint32, only kvindex.Tier) {
	in := &b.insts[id]
	for s, log := range in.logs {
		kept := log[:0]
		for _, h := range log {
			w, slot, ok := s.find(h, id)
			if !ok {
				continue
			}
			for t := kvindex.TierGPU; t <= kvindex.TierDisk; t++ {
				if (only == kvindex.TierUnspecified || only == t) && resRefs(w, t) != 0 {
					b.tiers[t]--
					w = resSetRefs(w, t, 0)
				}
			}
			if resMask(w) == 0 {
				in.blocks--
				b.counted(-1)
			} else {
				kept = append(kept, h)
			}
			s.set(h, id, slot, w)
		}
		if len(kept) == 0 {
			delete(in.logs, s)
		} else {
			in.logs[s] = kept
		}
		b.dropIfEmpty(s)
	}
}

// compactLog keeps each hash inst still holds in s once.
func (b *memBackend) compactLog(id uint32, s *memSpace) {
	log := b.insts[id].logs[s]
	slices.Sort(log)
	log = slices.Compact(log)
	kept := log[:0]
	for _, h := range log {
		if _, _, ok := s.find(h, id); ok {
			kept = append(kept, h)
		}
	}
	b.insts[id].logs[s] = slices.Clip(kept)
}

func (b *memBackend) dropInstance(id uint32) {
	b.clearInstance(id, kvindex.TierUnspecified)
	in := b.insts[id]
	delete(b.byKey, instKey{in.uid, in.rank})
	b.insts[id] = memInstance{}
	b.free = append(b.free, id)
}

// Apply implements kvindex.Store.
func (s *Store) Apply(_ context.Context, src kvindex.Source, d kvindex.Delta) (kvindex.Outcome, kvindex.Position, error) {
	b := s.lockBackend(src.Backend)
	defer b.mu.Unlock()
	id, exists := b.instance(src.PodUID, src.Rank, false)
	var pos kvindex.Position
	known := exists && b.insts[id].known
	if known {
		pos = b.insts[id].pos
	}
	restart := false
	switch {
	case known && d.Epoch == pos.Epoch && d.Sequence <= pos.Sequence:
		return kvindex.Duplicate, pos, nil
	case known && d.Epoch == pos.Epoch && d.Sequence == pos.Sequence+1:
	case d.Sequence == 1 && (!known || d.Epoch > pos.Epoch):
		restart = true
	default:
		return kvindex.NeedSnapshot, pos, nil
	}
	if s.limits != (kvindex.Limits{}) {
		if err := s.limits.Check(b.held(src.PodUID, id, exists, restart), kvindex.StoredHashes(d)); err != nil {
			return 0, pos, fmt.Errorf("delta %d of %s rank %d: %w", d.Sequence, src.PodUID, src.Rank, err)
		}
		if err := s.checkSpaces(b, kvindex.StoredSpaces(d)); err != nil {
			return 0, pos, fmt.Errorf("delta %d of %s rank %d: %w", d.Sequence, src.PodUID, src.Rank, err)
		}
	}
	if restart && exists {
		b.clearInstance(id, kvindex.TierUnspecified)
	}
	id, _ = b.instance(src.PodUID, src.Rank, true)
	for _, op := range d.Ops {
		switch op.Kind {
		case kvindex.OpClear:
			b.clearInstance(id, op.Tier)
		case kvindex.OpStore:
			if op.Tier == kvindex.TierUnspecified || op.Tier >= kvindex.NumTiers {
				continue
			}
			sp := b.space(op.Space, true)
			for _, h := range op.Hashes {
				b.add(sp, id, h, op.Tier, 1)
			}
		case kvindex.OpRemove:
			sp := b.space(op.Space, false)
			if sp == nil || op.Tier >= kvindex.NumTiers {
				continue
			}
			for _, h := range op.Hashes {
				if op.Tier == kvindex.TierUnspecified {
					for t := kvindex.TierGPU; t <= kvindex.TierDisk; t++ {
						b.remove(sp, id, h, t)
					}
				} else {
					b.remove(sp, id, h, op.Tier)
				}
			}
			b.dropIfEmpty(sp)
		}
	}
	pos = kvindex.Position{Epoch: d.Epoch, Sequence: d.Sequence}
	b.insts[id].known, b.insts[id].pos = true, pos
	return kvindex.Applied, pos, nil
}

// Replace implements kvindex.Store.
func (s *Store) Replace(_ context.Context, src kvindex.Source, pos kvindex.Position, snap *kvindex.Snapshot) error {
	b := s.lockBackend(src.Backend)
	defer b.mu.Unlock()
	id, exists := b.instance(src.PodUID, src.Rank, false)
	if exists && b.insts[id].known && b.insts[id].pos.Epoch > pos.Epoch {
		return fmt.Errorf("replace %s rank %d with epoch %d (holding %d): %w", src.PodUID, src.Rank, pos.Epoch, b.insts[id].pos.Epoch, kvindex.ErrStaleEpoch)
	}
	if s.limits != (kvindex.Limits{}) {
		if err := s.limits.Check(b.held(src.PodUID, id, exists, true), snap.DistinctBlocks()); err != nil {
			return fmt.Errorf("replacing %s rank %d: %w", src.PodUID, src.Rank, err)
		}
		if err := s.checkSpaces(b, snap.Spaces()); err != nil {
			return fmt.Errorf("replacing %s rank %d: %w", src.PodUID, src.Rank, err)
		}
	}
	id, _ = b.instance(src.PodUID, src.Rank, true)
	b.clearInstance(id, kvindex.TierUnspecified)
	for e := range snap.All() {
		if e.Tier == kvindex.TierUnspecified || e.Tier >= kvindex.NumTiers || e.Refs == 0 {
			continue
		}
		b.add(b.space(e.Space, true), id, e.Hash, e.Tier, e.Refs)
	}
	b.insts[id].known, b.insts[id].pos = true, pos
	return nil
}

// Positions implements kvindex.Store.
func (s *Store) Positions(_ context.Context, pod kvindex.PodKey) (map[uint32]kvindex.Position, error) {
	out := map[uint32]kvindex.Position{}
	b := s.backend(pod.Backend, false)
	if b == nil {
		return out, nil
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	if p := b.pods[pod.UID]; p != nil {
		for rank, id := range p.ranks {
			if b.insts[id].known {
				out[rank] = b.insts[id].pos
			}
		}
	}
	return out, nil
}

// Score implements kvindex.Store.
func (s *Store) Score(_ context.Context, backend kvindex.BackendRef, space kvindex.Space, hashes []uint64) ([]kvindex.Match, error) {
	b := s.backend(backend, false)
	if b == nil || len(hashes) == 0 {
		return nil, nil
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	sp := b.space(space, false)
	if sp == nil {
		return nil, nil
	}
	return bitWalk(sp, b.insts, hashes), nil
}

// walkBuf is the scratch space of one bitWalk.
type walkBuf struct {
	act  [5][]uint64
	tmp  []uint64
	lens [][5]uint32
	seen []uint32
	sink uint64 // lookAhead's touched words (per walk: no shared write)
	// The sparse phase: the few instances still matching, their match
	// bits (bitAny...), and slot[inst] = index+1 in them (0: not active).
	sInst []uint32
	sBits []uint8
	sMask []uint8
	slot  []uint8
}

var walkBufs = sync.Pool{New: func() any { return &walkBuf{} }}

func grown(b []uint64, n int) []uint64 {
	if cap(b) < n {
		return make([]uint64, n)
	}
	b = b[:n]
	clear(b)
	return b
}

// sparseMax is the number of matching instances below which bitWalk stops
// ANDing bitsets over every instance id and checks the few survivors one
// by one (a variable so that tests can force either phase).
var sparseMax = 48

// walkChunk is the number of blocks looked up ahead of the walk.
const walkChunk = 64

// postingOf is a block's residency as bitWalk reads it: a dense bitset
// copy (GPU, CPU, disk words), or a list of resident words.
type postingOf struct {
	dense []uint64
	list  []uint64
	one   uint64 // the resident word of an inline posting (list is nil)
	found bool
}

// lookAhead resolves the postings of hashes (at most walkChunk) into out.
// The passes are independent loads (map lookups, then slab headers, then
// the lists' first words), so the CPU overlaps their cache misses instead
// of taking them one by one in the walk. It returns a sum of the words it
// touched, for the caller to keep (so the loads are not dropped).
func (sp *memSpace) lookAhead(hashes []uint64, out *[walkChunk]postingOf) uint64 {
	var words [walkChunk]uint64
	for j, h := range hashes {
		words[j], out[j].found = sp.blocks[h]
	}
	for j := range hashes {
		p := words[j]
		o := &out[j]
		o.dense, o.list, o.one = nil, nil, p
		switch {
		case !o.found || p&multiFlag == 0:
		case p&denseFlag != 0:
			o.dense = sp.dense[uint32(p)]
		default:
			o.list = sp.multi[uint32(p)]
		}
	}
	var touch uint64
	for j := range hashes {
		o := &out[j]
		if o.dense != nil {
			touch += o.dense[0]
		} else if len(o.list) > 0 {
			touch += o.list[0] ^ o.list[len(o.list)-1]
		}
	}
	return touch
}

// bitWalk is the memory store's prefix walk: active instances per match
// kind (any, GPU, CPU, disk, GPU or CPU) are bitsets over instance ids, and
// each block ANDs them with the block's residency (its dense bitsets, or
// bits set from a short list), so a block held by every pod costs a few
// dozen word operations, not one visit per pod. An instance that drops out
// of a kind at block i matched i blocks of it. Once fewer than sparseMax
// instances still match, the walk checks just those per block (the
// sparse phase) instead of every word of the bitsets.
func bitWalk(sp *memSpace, insts []memInstance, hashes []uint64) []kvindex.Match {
	words := (len(insts) + 63) / 64
	wb := walkBufs.Get().(*walkBuf)
	defer walkBufs.Put(wb)
	for k := range wb.act {
		wb.act[k] = grown(wb.act[k], words)
	}
	wb.tmp = grown(wb.tmp, 3*words)
	if cap(wb.lens) < len(insts) {
		wb.lens = make([][5]uint32, len(insts))
	}
	lens := wb.lens[:len(insts)]
	wb.seen = wb.seen[:0]
	act := &wb.act
	if cap(wb.slot) < len(insts) {
		wb.slot = make([]uint8, len(insts))
	}
	slot := wb.slot[:len(insts)] // all zero between walks
	sparse := false
	wb.sInst, wb.sBits = wb.sInst[:0], wb.sBits[:0]

	dropAll := func(i uint32) {
		if sparse {
			for a, inst := range wb.sInst {
				for v := wb.sBits[a]; v != 0; v &= v - 1 {
					lens[inst][bits.TrailingZeros8(v)] = i
				}
			}
			return
		}
		for k := range act {
			for j, v := range act[k] {
				for v != 0 {
					lens[j*64+bits.TrailingZeros64(v)][k] = i
					v &= v - 1
				}
			}
		}
	}
	end := uint32(len(hashes))
	var chunk [walkChunk]postingOf
walk:
	for i := range hashes {
		k := i % walkChunk
		if k == 0 {
			wb.sink += sp.lookAhead(hashes[i:min(i+walkChunk, len(hashes))], &chunk)
		}
		c := &chunk[k]
		if !c.found {
			if i > 0 {
				dropAll(uint32(i))
			}
			end = 0
			break
		}
		list := c.list
		if c.dense == nil && list == nil {
			list = []uint64{c.one}
		}
		if sparse {
			if !sparseStep(wb, slot, lens, c.dense, list, uint32(i)) {
				end = 0
				break walk
			}
			continue
		}
		// The block's tier bitsets: dense, or set in tmp from the list.
		post, pw := c.dense, words
		if post != nil {
			pw = len(post) / 3
			list = nil
		} else {
			post = wb.tmp
			for _, r := range list {
				if inst := resInst(r); int(inst) < len(insts) {
					setDense(post, words, inst, resMask(r))
				}
			}
		}
		alive, count := uint64(0), 0
		for j := range words {
			var g, c, d uint64
			if j < pw {
				g, c, d = post[j], post[pw+j], post[2*pw+j]
			}
			nk := [5]uint64{g | c | d, g, c, d, g | c}
			if i == 0 {
				for k := range act {
					act[k][j] = nk[k]
				}
				for v := nk[0]; v != 0; v &= v - 1 {
					wb.seen = append(wb.seen, uint32(j*64+bits.TrailingZeros64(v)))
				}
				alive |= nk[0]
				count += bits.OnesCount64(nk[0])
				continue
			}
			for k := range act {
				old := act[k][j]
				nv := old & nk[k]
				for dropped := old &^ nv; dropped != 0; dropped &= dropped - 1 {
					lens[j*64+bits.TrailingZeros64(dropped)][k] = uint32(i)
				}
				act[k][j] = nv
			}
			alive |= act[0][j]
			count += bits.OnesCount64(act[0][j])
		}
		for _, r := range list {
			if inst := resInst(r); int(inst) < len(insts) {
				setDense(post, words, inst, 0)
			}
		}
		if alive == 0 {
			end = 0
			break walk
		}
		if count < sparseMax && count < 256 { // slot holds index+1 in a byte
			// Few instances left: carry their match bits as a list.
			sparse = true
			for j, v := range act[0] {
				for ; v != 0; v &= v - 1 {
					b := bits.TrailingZeros64(v)
					var m uint8
					for k := range act {
						m |= uint8(act[k][j]>>b&1) << k
					}
					wb.sInst = append(wb.sInst, uint32(j*64+b))
					wb.sBits = append(wb.sBits, m)
					slot[j*64+b] = uint8(len(wb.sInst))
				}
			}
		}
	}
	if end > 0 {
		dropAll(end)
	}
	for _, inst := range wb.sInst {
		slot[inst] = 0
	}
	out := make([]kvindex.Match, 0, len(wb.seen))
	for _, inst := range wb.seen {
		if in := &insts[inst]; in.used {
			out = append(out, kvindex.MatchFrom(in.uid, in.rank, lens[inst]))
		}
		lens[inst] = [5]uint32{}
	}
	return out
}

// sparseStep walks block i of the sparse phase: each instance still
// matching keeps the match bits the block's residency allows; the others
// are left, with i blocks matched. It reports whether any is left.
func sparseStep(wb *walkBuf, slot []uint8, lens [][5]uint32, dense, list []uint64, i uint32) bool {
	n := len(wb.sInst)
	if cap(wb.sMask) < n {
		wb.sMask = make([]uint8, n)
	}
	mask := wb.sMask[:n]
	if dense != nil {
		pw := len(dense) / 3
		for a, inst := range wb.sInst {
			j, b := int(inst)/64, inst%64
			var m uint8
			if j < pw {
				m = uint8(dense[j]>>b&1)<<kvindex.TierGPU | uint8(dense[pw+j]>>b&1)<<kvindex.TierCPU | uint8(dense[2*pw+j]>>b&1)<<kvindex.TierDisk
			}
			mask[a] = m
		}
	} else {
		clear(mask)
		for _, r := range list {
			if inst := resInst(r); int(inst) < len(slot) {
				if s := slot[inst]; s != 0 {
					mask[s-1] = resMask(r)
				}
			}
		}
	}
	kept := 0
	for a, inst := range wb.sInst {
		old := wb.sBits[a]
		nb := old & kvindex.MatchBits(mask[a])
		for dropped := old &^ nb; dropped != 0; dropped &= dropped - 1 {
			lens[inst][bits.TrailingZeros8(dropped)] = i
		}
		if nb == 0 {
			slot[inst] = 0
			continue
		}
		wb.sInst[kept], wb.sBits[kept] = inst, nb
		slot[inst] = uint8(kept + 1)
		kept++
	}
	wb.sInst, wb.sBits = wb.sInst[:kept], wb.sBits[:kept]
	return kept > 0
}

// TierBlocks implements kvindex.Store.
func (s *Store) TierBlocks(_ context.Context, backend kvindex.BackendRef) ([kvindex.NumTiers]uint64, error) {
	b := s.backend(backend, false)
	if b == nil {
		return [kvindex.NumTiers]uint64{}, nil
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.tiers, nil
}

// PodBlocks implements kvindex.Store.
func (s *Store) PodBlocks(_ context.Context, pod kvindex.PodKey) (uint64, error) {
	b := s.backend(pod.Backend, false)
	if b == nil {
		return 0, nil
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	var n uint64
	if p := b.pods[pod.UID]; p != nil {
		for _, id := range p.ranks {
			n += b.insts[id].blocks
		}
	}
	return n, nil
}

// PutPod implements kvindex.Store.
func (s *Store) PutPod(_ context.Context, rec kvindex.PodRecord, leaseUntil time.Time) error {
	b := s.lockBackend(rec.Backend)
	defer b.mu.Unlock()
	p := b.pods[rec.UID]
	if p == nil {
		p = &memPod{ranks: map[uint32]uint32{}}
		b.pods[rec.UID] = p
	}
	p.rec, p.leaseUntil = rec, leaseUntil
	return nil
}

// Pods implements kvindex.Store.
func (s *Store) Pods(_ context.Context, backend kvindex.BackendRef) ([]kvindex.PodRecord, error) {
	b := s.backend(backend, false)
	if b == nil {
		return nil, nil
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	out := make([]kvindex.PodRecord, 0, len(b.pods))
	for _, p := range b.pods {
		if p.rec.Name != "" {
			out = append(out, p.rec)
		}
	}
	return out, nil
}

// ExpireLeases implements kvindex.Store.
func (s *Store) ExpireLeases(_ context.Context, now time.Time) ([]kvindex.PodKey, error) {
	s.mu.RLock()
	backends := make(map[kvindex.BackendRef]*memBackend, len(s.backends))
	for k, v := range s.backends {
		backends[k] = v
	}
	s.mu.RUnlock()
	var gone []kvindex.PodKey
	for ref, b := range backends {
		b.mu.Lock()
		for uid, p := range b.pods {
			if !p.leaseUntil.Before(now) {
				continue
			}
			for _, id := range p.ranks {
				b.dropInstance(id)
			}
			delete(b.pods, uid)
			gone = append(gone, kvindex.PodKey{Backend: ref, UID: uid})
		}
		if len(b.pods) == 0 {
			// The backend's last pod is gone: so are its spaces, slabs and
			// instance table, and its place in the namespace's count.
			s.drop(ref, b)
		}
		b.mu.Unlock()
	}
	return gone, nil
}

// drop removes backend b (locked, without pods) from the store.
func (s *Store) drop(ref kvindex.BackendRef, b *memBackend) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.backends[ref] != b {
		return
	}
	b.dead = true
	delete(s.backends, ref)
	b.ns.blocks.Add(-int64(b.blocks))
	b.ns.spaces.Add(-int64(len(b.spaces)))
	if b.ns.backends--; b.ns.backends == 0 {
		delete(s.namespaces, ref.Namespace)
	}
}

// Close implements kvindex.Store.
func (s *Store) Close() error { return nil }
