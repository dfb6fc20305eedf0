package redisstore

import (
	"testing"

	"github.com/inferencecache/operator/internal/kvindex"
)

// hashesOf counts the block hashes a step's payload names.
func hashesOf(step []any) int {
	n := 0
	for i := 0; i < len(step); {
		if step[i] == "C" {
			i += 2
			continue
		}
		k := step[i+3].(int)
		n += k
		i += 4 + k
	}
	return n
}

func TestDeltaStepsBoundEveryScript(t *testing.T) {
	sp := kvindex.Space{Model: "m"}
	hs := func(n int) []uint64 {
		out := make([]uint64, n)
		for i := range out {
			out[i] = uint64(i)
		}
		return out
	}
	store := func(n int) kvindex.Op {
		return kvindex.Op{Kind: kvindex.OpStore, Tier: kvindex.TierGPU, Space: sp, Hashes: hs(n)}
	}
	clearAll := kvindex.Op{Kind: kvindex.OpClear}
	tests := []struct {
		name  string
		ops   []kvindex.Op
		steps []int // hashes per step, -1 for a clear
	}{
		{"empty delta: one call", nil, []int{0}},
		{"small delta: one call", []kvindex.Op{store(3), store(4)}, []int{7}},
		{"exactly a chunk", []kvindex.Op{store(8)}, []int{8}},
		{"ops cut across chunks", []kvindex.Op{store(5), store(7)}, []int{8, 4}},
		{"a leading clear gets its own step after an empty begin", []kvindex.Op{clearAll, store(3)}, []int{0, -1, 3}},
		{"a clear between stores keeps its place", []kvindex.Op{store(3), clearAll, store(9)}, []int{3, -1, 8, 1}},
		{"the 300k-hash delta", []kvindex.Op{store(300_000)}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			chunk := 8
			if tt.steps == nil {
				chunk = DefaultChunkHashes
			}
			steps := deltaSteps(kvindex.Delta{Ops: tt.ops}, chunk)
			var got []int
			total := 0
			for _, st := range steps {
				if len(st) > 0 && st[0] == "C" {
					got = append(got, -1)
					continue
				}
				n := hashesOf(st)
				if n > chunk {
					t.Fatalf("a step of %d hashes, over the chunk of %d", n, chunk)
				}
				got = append(got, n)
				total += n
			}
			if tt.steps == nil {
				if total != 300_000 || len(steps) != (300_000+chunk-1)/chunk {
					t.Fatalf("%d hashes in %d steps, want 300000 in %d", total, len(steps), (300_000+chunk-1)/chunk)
				}
				return
			}
			if len(got) != len(tt.steps) {
				t.Fatalf("steps %v, want %v", got, tt.steps)
			}
			for i := range got {
				if got[i] != tt.steps[i] {
					t.Fatalf("steps %v, want %v", got, tt.steps)
				}
			}
		})
	}
}
