package kvindex

import "sync"

// Match bits tracked per instance while walking a prompt.
const (
	bitAny uint8 = 1 << iota
	bitGPU
	bitCPU
	bitDisk
	bitGPUOrCPU
)

// TierBit is the bit of a tier in a residency mask (1<<tier).
func TierBit(t Tier) uint8 { return 1 << t }

// deriveBits maps a residency's tier mask to the match bits it keeps alive.
var deriveBits = func() (d [16]uint8) {
	for m := range 16 {
		var b uint8
		if m&^1 != 0 {
			b |= bitAny
		}
		if m&int(TierBit(TierGPU)) != 0 {
			b |= bitGPU | bitGPUOrCPU
		}
		if m&int(TierBit(TierCPU)) != 0 {
			b |= bitCPU | bitGPUOrCPU
		}
		if m&int(TierBit(TierDisk)) != 0 {
			b |= bitDisk
		}
		d[m] = b
	}
	return d
}()

// MatchBits maps a residency's tier mask (bit 1<<tier per tier) to the
// match kinds it keeps alive, bit k for kind k of a PrefixWalk's lengths
// (any, GPU, CPU, disk, GPU or CPU).
func MatchBits(mask uint8) uint8 { return deriveBits[mask&15] }

// PrefixWalk computes, per instance (a dense id), how many leading blocks of
// a prompt it holds: for any tier, for each tier alone, and for GPU or CPU.
// The caller visits each block's residents in prompt order with Visit and
// closes each block with Next; the walk ends when no instance is left.
// Cost: the residents of the matched prefix, never the whole index.
type PrefixWalk struct {
	step   uint32
	active []uint32
	next   []uint32
	state  []uint8
	stamp  []uint32
	lens   [][5]uint32
}

var walkPool = sync.Pool{New: func() any { return &PrefixWalk{} }}

// NewPrefixWalk returns a walk for instance ids below instances (it grows
// past that when needed).
func NewPrefixWalk(instances int) *PrefixWalk {
	w := walkPool.Get().(*PrefixWalk)
	w.reset(instances)
	return w
}

// Release returns the walk to its pool.
func (w *PrefixWalk) Release() { walkPool.Put(w) }

func (w *PrefixWalk) reset(n int) {
	w.step = 0
	w.active = w.active[:0]
	w.next = w.next[:0]
	if cap(w.state) < n {
		w.state = make([]uint8, n)
		w.stamp = make([]uint32, n)
		w.lens = make([][5]uint32, n)
	} else {
		w.state = w.state[:n]
		w.stamp = w.stamp[:n]
		w.lens = w.lens[:n]
		clear(w.state)
		clear(w.stamp)
		clear(w.lens)
	}
}

// Visit records that inst holds the current block in the tiers of mask
// (bit 1<<tier per tier).
func (w *PrefixWalk) Visit(inst uint32, mask uint8) {
	if int(inst) >= len(w.state) {
		w.grow(int(inst) + 1)
	}
	bits := deriveBits[mask&15]
	if bits == 0 {
		return
	}
	if w.step == 0 {
		if w.stamp[inst] != 0 {
			return
		}
		w.state[inst] = bits
	} else {
		if w.stamp[inst] != w.step {
			return // not alive after the previous block, or already visited
		}
		bits &= w.state[inst]
		if bits == 0 {
			return
		}
		w.state[inst] = bits
	}
	w.stamp[inst] = w.step + 1
	l := &w.lens[inst]
	for i := range 5 {
		if bits&(1<<i) != 0 {
			l[i]++
		}
	}
	w.next = append(w.next, inst)
}

func (w *PrefixWalk) grow(n int) {
	n = max(n, 2*len(w.state))
	w.state = append(w.state, make([]uint8, n-len(w.state))...)
	w.stamp = append(w.stamp, make([]uint32, n-len(w.stamp))...)
	w.lens = append(w.lens, make([][5]uint32, n-len(w.lens))...)
}

// Next closes the current block; it reports whether any instance still
// matches, i.e. whether the next block is worth looking up.
func (w *PrefixWalk) Next() bool {
	w.active, w.next = w.next, w.active[:0]
	w.step++
	return len(w.active) > 0
}

// Results lists every instance that matched at least the first block, in no
// particular order, with its lengths.
func (w *PrefixWalk) Results(fn func(inst uint32, l [5]uint32)) {
	for inst, s := range w.stamp {
		if s != 0 {
			fn(uint32(inst), w.lens[inst])
		}
	}
}

// MatchFrom makes the Match of one instance from its Results lengths.
func MatchFrom(uid string, rank uint32, l [5]uint32) Match {
	return Match{PodUID: uid, Rank: rank, Any: l[0], GPU: l[1], CPU: l[2], Disk: l[3], GPUOrCPU: l[4]}
}
