package mirror_test

import (
	"testing"

	"github.com/inferencecache/operator/internal/kvevent/mirror"
	"github.com/inferencecache/operator/internal/kvevent/wire"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

func st(medium string, group int, kind string, hashes ...uint64) wire.Event {
	return wire.Event{Kind: wire.BlockStored, Hashes: hashes, Medium: medium, Group: group, SpecKind: kind,
		Tokens: make([]uint32, 4*len(hashes)), BlockSize: 4}
}

func rm(medium string, hashes ...uint64) wire.Event {
	return wire.Event{Kind: wire.BlockRemoved, Hashes: hashes, Medium: medium}
}

func TestApply(t *testing.T) {
	gpu := func(h uint64) mirror.Key { return mirror.Key{Hash: h, Tier: pb.Tier_TIER_GPU} }
	for _, tc := range []struct {
		name      string
		events    []wire.Event
		want      map[mirror.Key]uint32
		forwarded int // block hashes forwarded (stores + removes)
		unknown   uint64
	}{
		{"store and remove", []wire.Event{st("GPU", 0, "", 1, 2), rm("GPU", 1)}, map[mirror.Key]uint32{gpu(2): 1}, 3, 0},
		{"duplicate blocks are reference counted", []wire.Event{st("GPU", 0, "", 1), st("GPU", 0, "", 1), rm("GPU", 1)},
			map[mirror.Key]uint32{gpu(1): 1}, 3, 0},
		{"removal of an unknown block is dropped", []wire.Event{rm("GPU", 7)}, map[mirror.Key]uint32{}, 0, 1},
		{"tiers are separate", []wire.Event{st("GPU", 0, "", 1), st("CPU_PINNED", 0, "", 1), rm("CPU", 1)},
			map[mirror.Key]uint32{gpu(1): 1}, 3, 0},
		{"no medium is GPU", []wire.Event{st("", 0, "", 1)}, map[mirror.Key]uint32{gpu(1): 1}, 1, 0},
		{"sliding-window groups are not a prefix", []wire.Event{st("GPU", 1, "sliding_window", 5), st("GPU", 0, "full_attention", 6)},
			map[mirror.Key]uint32{gpu(6): 1}, 1, 0},
		{"clear", []wire.Event{st("GPU", 0, "", 1, 2), {Kind: wire.AllBlocksCleared}, st("DISK", 0, "", 3)},
			map[mirror.Key]uint32{{Hash: 3, Tier: pb.Tier_TIER_DISK}: 1}, 3, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := mirror.New()
			out := m.Apply(tc.events, false, []*pb.BlockEvent{})
			got := map[mirror.Key]uint32{}
			m.Snapshot(func(e mirror.Entry) { got[e.Key] = e.Refs })
			if len(got) != len(tc.want) {
				t.Fatalf("mirror %v, want %v", got, tc.want)
			}
			for k, n := range tc.want {
				if got[k] != n {
					t.Fatalf("mirror %v, want %v", got, tc.want)
				}
			}
			fw := 0
			for _, e := range out {
				switch x := e.Event.(type) {
				case *pb.BlockEvent_Stored:
					fw += len(x.Stored.BlockHashes)
					if len(x.Stored.TokenIds) != 0 {
						t.Errorf("token IDs forwarded")
					}
				case *pb.BlockEvent_Removed:
					fw += len(x.Removed.BlockHashes)
				}
			}
			if fw != tc.forwarded {
				t.Errorf("forwarded %d block hashes, want %d", fw, tc.forwarded)
			}
			if m.Stats.UnknownRemovals != tc.unknown {
				t.Errorf("unknown removals %d, want %d", m.Stats.UnknownRemovals, tc.unknown)
			}
		})
	}
}

func TestChunks(t *testing.T) {
	m := mirror.New()
	var hs []uint64
	for i := uint64(1); i <= 25; i++ {
		hs = append(hs, i)
	}
	m.Apply([]wire.Event{st("GPU", 0, "", hs...), st("GPU", 0, "", 3), st("CPU", 0, "", 1)}, false, nil)
	chunks, count := m.Chunks(2, 9, 10)
	if count != 26 {
		t.Fatalf("count %d, want 26", count)
	}
	total, refs := 0, map[pb.Tier]map[uint64]uint32{}
	for _, c := range chunks {
		if c.Rank != 2 || c.Epoch != 9 {
			t.Fatalf("chunk for rank %d epoch %d", c.Rank, c.Epoch)
		}
		n := 0
		for _, e := range c.Entries {
			n += len(e.BlockHashes)
			if refs[e.Tier] == nil {
				refs[e.Tier] = map[uint64]uint32{}
			}
			for i, h := range e.BlockHashes {
				r := uint32(1)
				if len(e.RefCounts) > 0 {
					r = e.RefCounts[i]
				}
				refs[e.Tier][h] = r
			}
		}
		if n > 10 {
			t.Fatalf("chunk of %d hashes, want at most 10", n)
		}
		total += n
	}
	if total != 26 || refs[pb.Tier_TIER_GPU][3] != 2 || refs[pb.Tier_TIER_GPU][4] != 1 || refs[pb.Tier_TIER_CPU][1] != 1 {
		t.Fatalf("total %d, refs %v", total, refs)
	}
}

// TestApplyMergesRemovals: the block pool's one-event-per-block removals
// are forwarded as one event per tier, LoRA and group run.
func TestApplyMergesRemovals(t *testing.T) {
	m := mirror.New()
	m.Apply([]wire.Event{st("GPU", 0, "", 1, 2, 3), st("CPU", 0, "", 4)}, false, nil)
	out := m.Apply([]wire.Event{rm("GPU", 1), rm("GPU", 2), rm("CPU", 4), rm("GPU", 3), rm("GPU", 9)}, false, []*pb.BlockEvent{})
	var got [][]uint64
	for _, e := range out {
		got = append(got, e.GetRemoved().GetBlockHashes())
	}
	if len(got) != 3 || len(got[0]) != 2 || got[1][0] != 4 || len(got[2]) != 1 || got[2][0] != 3 {
		t.Fatalf("forwarded removals %v, want [[1 2] [4] [3]]", got)
	}
}
