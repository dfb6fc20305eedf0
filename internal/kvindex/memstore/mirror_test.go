package memstore_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/memstore"
)

func TestSetResidencies(t *testing.T) {
	ctx := context.Background()
	be := kvindex.BackendRef{Namespace: "ns", Name: "cache"}
	sp := kvindex.Space{Model: "m", Scheme: "s"}
	gpu, cpu, disk := kvindex.TierBit(kvindex.TierGPU), kvindex.TierBit(kvindex.TierCPU), kvindex.TierBit(kvindex.TierDisk)
	type set struct {
		uid  string
		rank uint32
		rs   []memstore.Residency
	}
	res := func(h uint64, mask uint8) memstore.Residency {
		return memstore.Residency{Space: sp, Hash: h, Mask: mask}
	}
	cases := []struct {
		name     string
		sets     []set
		want     []kvindex.Match // Score of blocks 1, 2, 3
		tiers    [kvindex.NumTiers]uint64
		backends int
	}{{
		name:  "one pod, tiers as masked",
		sets:  []set{{"a", 0, []memstore.Residency{res(1, gpu|cpu), res(2, gpu), res(3, cpu)}}},
		want:  []kvindex.Match{{PodUID: "a", Any: 3, GPU: 2, CPU: 1, GPUOrCPU: 3}},
		tiers: [kvindex.NumTiers]uint64{0, 2, 2, 0}, backends: 2,
	}, {
		name: "a later mask replaces an earlier one, tier by tier",
		sets: []set{
			{"a", 0, []memstore.Residency{res(1, gpu), res(2, gpu), res(3, gpu)}},
			{"a", 0, []memstore.Residency{res(2, disk), res(1, gpu|cpu), res(2, cpu|disk)}},
		},
		want:  []kvindex.Match{{PodUID: "a", Any: 3, GPU: 1, CPU: 2, GPUOrCPU: 3}},
		tiers: [kvindex.NumTiers]uint64{0, 2, 2, 1}, backends: 2,
	}, {
		name: "two pods and ranks",
		sets: []set{
			{"a", 0, []memstore.Residency{res(1, gpu), res(2, gpu)}},
			{"b", 1, []memstore.Residency{res(1, cpu)}},
		},
		want:  []kvindex.Match{{PodUID: "a", Any: 2, GPU: 2, GPUOrCPU: 2}, {PodUID: "b", Rank: 1, Any: 1, CPU: 1, GPUOrCPU: 1}},
		tiers: [kvindex.NumTiers]uint64{0, 2, 1, 0}, backends: 2,
	}, {
		name: "mask 0 removes; a pod without blocks is forgotten",
		sets: []set{
			{"a", 0, []memstore.Residency{res(1, gpu), res(2, gpu)}},
			{"b", 0, []memstore.Residency{res(1, gpu)}},
			{"b", 0, []memstore.Residency{res(1, 0)}},
			{"a", 0, []memstore.Residency{res(2, 0)}},
		},
		want:  []kvindex.Match{{PodUID: "a", Any: 1, GPU: 1, GPUOrCPU: 1}},
		tiers: [kvindex.NumTiers]uint64{0, 1, 0, 0}, backends: 2,
	}, {
		name: "the last pod's last block takes the backend with it",
		sets: []set{
			{"a", 0, []memstore.Residency{res(1, gpu)}},
			{"a", 0, []memstore.Residency{res(1, 0), res(9, 0)}},
		},
		backends: 0,
	}, {
		name:     "removing what was never held creates nothing",
		sets:     []set{{"a", 0, []memstore.Residency{res(1, 0)}}},
		backends: 0,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := memstore.New()
			for _, st := range tc.sets {
				s.SetResidencies(be, st.uid, st.rank, st.rs)
			}
			got, err := s.Score(ctx, be, sp, []uint64{1, 2, 3})
			require.NoError(t, err)
			assert.ElementsMatch(t, tc.want, got)
			tiers, err := s.TierBlocks(ctx, be)
			require.NoError(t, err)
			assert.Equal(t, tc.tiers, tiers)
			assert.Equal(t, tc.backends, memstore.Backends(s), "backends and namespaces kept")
		})
	}
}

func TestDropBackend(t *testing.T) {
	ctx := context.Background()
	be := kvindex.BackendRef{Namespace: "ns", Name: "cache"}
	other := kvindex.BackendRef{Namespace: "ns", Name: "other"}
	sp := kvindex.Space{Model: "m"}
	s := memstore.New()
	s.SetResidencies(be, "a", 0, []memstore.Residency{{Space: sp, Hash: 1, Mask: kvindex.TierBit(kvindex.TierGPU)}})
	s.SetResidencies(other, "b", 0, []memstore.Residency{{Space: sp, Hash: 1, Mask: kvindex.TierBit(kvindex.TierGPU)}})
	s.DropBackend(be)
	got, err := s.Score(ctx, be, sp, []uint64{1})
	require.NoError(t, err)
	assert.Empty(t, got)
	got, err = s.Score(ctx, other, sp, []uint64{1})
	require.NoError(t, err)
	assert.Len(t, got, 1)
	s.DropBackend(other)
	assert.Zero(t, memstore.Backends(s))
}
