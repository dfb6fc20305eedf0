package kvindex

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/inferencecache/operator/internal/kvevent/hashcheck"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// PrefixMatch is one pod's answer to a router that names workers by
// address: the leading blocks of a prompt it holds where an engine can
// serve them from (GPU or CPU).
type PrefixMatch struct {
	Pod     string
	Address string
	Blocks  uint32
}

// MatchPrefix answers SGLang's router (kv_indexer.v1 MatchExternalKvPrefix)
// for one backend: per pod that publishes SGLang's page hashes and named
// its router-facing address, the longest run of hashes[0..n) it holds in
// GPU or CPU, its ranks merged (the router sees one URL a pod). Disk is
// left out, as SGLang's own index leaves SSD out. The router names no
// model, so every model's pods answer; a router asks only about its own
// workers' addresses. Unsynced pods are left out, as in ScoreByRank. The
// answer is longest first, then by address.
//
// It authorizes nobody: cache-index serves it only on a listener the
// operator bound to this backend (--sglang-kv-indexer), because the
// router's client sends no credentials.
func (ix *Index) MatchPrefix(ctx context.Context, backend BackendRef, hashes []uint64) ([]PrefixMatch, error) {
	start := time.Now()
	if err := checkBackend(backend); err != nil {
		return nil, err
	}
	if err := checkPrompt(hashes, nil); err != nil {
		return nil, err
	}
	recs, err := ix.opt.Store.Pods(ctx, backend)
	if err != nil {
		return nil, fmt.Errorf("listing pods of %s: %w", backend, err)
	}
	now := ix.opt.Now()
	pods := map[string]PodRecord{}
	spaces := map[Space]bool{}
	for _, r := range recs {
		if alg, _ := schemeParts(r.Scheme); alg != hashcheck.SGLangSHA256 || r.Address == "" {
			continue
		}
		if ix.podState(r, 1, now) == pb.PodState_POD_STATE_UNSYNCED {
			continue
		}
		pods[r.UID] = r
		spaces[Space{Model: r.Model, Scheme: r.Scheme}] = true
	}
	best := map[string]*PrefixMatch{}
	for _, sp := range slices.SortedFunc(maps.Keys(spaces), func(a, b Space) int {
		return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.Scheme, b.Scheme))
	}) {
		ms, err := ix.opt.Store.Score(ctx, backend, sp, hashes)
		if err != nil {
			return nil, fmt.Errorf("scoring in %s: %w", backend, err)
		}
		for _, m := range ms {
			rec, ok := pods[m.PodUID]
			if !ok || m.GPUOrCPU == 0 {
				continue
			}
			if cur := best[m.PodUID]; cur == nil {
				best[m.PodUID] = &PrefixMatch{Pod: rec.Name, Address: rec.Address, Blocks: m.GPUOrCPU}
			} else {
				cur.Blocks = max(cur.Blocks, m.GPUOrCPU)
			}
		}
	}
	out := make([]PrefixMatch, 0, len(best))
	for _, m := range best {
		out = append(out, *m)
	}
	slices.SortFunc(out, func(a, b PrefixMatch) int {
		return cmp.Or(cmp.Compare(b.Blocks, a.Blocks), cmp.Compare(a.Address, b.Address), cmp.Compare(a.Pod, b.Pod))
	})
	ix.opt.Observer.Scored(time.Since(start))
	return out, nil
}
