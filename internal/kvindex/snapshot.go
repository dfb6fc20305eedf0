package kvindex

import (
	"errors"
	"iter"
	"slices"
	"sort"
)

// Snapshot is the content of one rank's snapshot, as its chunks brought
// it: each chunk's entries in a slice of exactly their size, allocated
// when the chunk arrives (nothing is reserved for the count a
// SnapshotBegin announces, nothing is copied when more arrive), 16 bytes
// an entry: its space is an index into the snapshot's few spaces, not a
// copy of three strings. A Store reads it through All and Range.
type Snapshot struct {
	spaces []Space
	chunks [][]snapEntry
	starts []int // starts[i]: the index of chunks[i]'s first entry
	n      int
}

type snapEntry struct {
	hash  uint64
	refs  uint32
	tier  Tier
	space uint16
}

// maxSnapshotSpaces bounds the spaces (LoRA adapters) one snapshot names.
const maxSnapshotSpaces = 1 << 16

// errTooManySpaces refuses a chunk past maxSnapshotSpaces.
var errTooManySpaces = errors.New("a snapshot names more than 65,536 spaces")

// SnapshotOf returns a Snapshot of entries (for tests and tools; the
// ingest session builds one chunk at a time with Add).
func SnapshotOf(entries []Entry) *Snapshot {
	s := &Snapshot{}
	if len(entries) == 0 {
		return s
	}
	c := make([]snapEntry, len(entries))
	for i, e := range entries {
		sp, err := s.spaceIndex(e.Space)
		if err != nil {
			panic(err) // a test naming 65,537 spaces
		}
		c[i] = snapEntry{hash: e.Hash, refs: e.Refs, tier: e.Tier, space: sp}
	}
	s.push(c)
	return s
}

// Add appends one run of a chunk: hashes of space in tier, with their
// reference counts (nil: one each; otherwise as many as hashes).
func (s *Snapshot) Add(space Space, tier Tier, hashes []uint64, refs []uint32) error {
	if len(hashes) == 0 {
		return nil
	}
	sp, err := s.spaceIndex(space)
	if err != nil {
		return err
	}
	c := make([]snapEntry, len(hashes))
	for i, h := range hashes {
		n := uint32(1)
		if refs != nil {
			n = refs[i]
		}
		c[i] = snapEntry{hash: h, refs: n, tier: tier, space: sp}
	}
	s.push(c)
	return nil
}

func (s *Snapshot) push(c []snapEntry) {
	s.chunks = append(s.chunks, c)
	s.starts = append(s.starts, s.n)
	s.n += len(c)
}

func (s *Snapshot) spaceIndex(sp Space) (uint16, error) {
	if i := slices.Index(s.spaces, sp); i >= 0 {
		return uint16(i), nil
	}
	if len(s.spaces) == maxSnapshotSpaces {
		return 0, errTooManySpaces
	}
	s.spaces = append(s.spaces, sp)
	return uint16(len(s.spaces) - 1), nil
}

// Spaces lists the spaces the snapshot's entries name.
func (s *Snapshot) Spaces() []Space {
	if s == nil {
		return nil
	}
	return s.spaces
}

// Len is the number of entries.
func (s *Snapshot) Len() int {
	if s == nil {
		return 0
	}
	return s.n
}

// All yields every entry in order.
func (s *Snapshot) All() iter.Seq[Entry] { return s.Range(0, s.Len()) }

// Range yields the entries [start, end) in order.
func (s *Snapshot) Range(start, end int) iter.Seq[Entry] {
	return func(yield func(Entry) bool) {
		if s == nil {
			return
		}
		end = min(end, s.n)
		if start >= end {
			return
		}
		ci := sort.SearchInts(s.starts, start+1) - 1
		for i := start; i < end; ci++ {
			c := s.chunks[ci][i-s.starts[ci]:]
			for _, e := range c[:min(len(c), end-i)] {
				if !yield(Entry{Space: s.spaces[e.space], Tier: e.tier, Hash: e.hash, Refs: e.refs}) {
					return
				}
				i++
			}
		}
	}
}

// DistinctBlocks counts the distinct (space, hash) of the entries a
// Replace stores (a real tier and at least one reference): the blocks the
// rank holds after the snapshot. It takes 8 bytes an entry while it
// counts.
func (s *Snapshot) DistinctBlocks() uint64 {
	if s.Len() == 0 {
		return 0
	}
	counts := make([]int, len(s.spaces))
	for _, c := range s.chunks {
		for _, e := range c {
			if stored(e.tier, e.refs) {
				counts[e.space]++
			}
		}
	}
	bySpace := make([][]uint64, len(s.spaces))
	for i, n := range counts {
		bySpace[i] = make([]uint64, 0, n)
	}
	for _, c := range s.chunks {
		for _, e := range c {
			if stored(e.tier, e.refs) {
				bySpace[e.space] = append(bySpace[e.space], e.hash)
			}
		}
	}
	var n uint64
	for _, hs := range bySpace {
		slices.Sort(hs)
		n += uint64(len(slices.Compact(hs)))
	}
	return n
}

func stored(t Tier, refs uint32) bool {
	return t != TierUnspecified && t < NumTiers && refs != 0
}
