package kvindex

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// Score answers a router's query: per pod, its best rank's longest prefix.
func (ix *Index) Score(ctx context.Context, caller Caller, req *pb.ScoreRequest) (*pb.ScoreResponse, error) {
	start := time.Now()
	backend := BackendRef{Namespace: req.GetCacheBackend().GetNamespace(), Name: req.GetCacheBackend().GetName()}
	if n := len(req.GetCandidatePods()); n > MaxCandidatePods {
		return nil, fmt.Errorf("candidate_pods names %d pods, over the index's bound of %d: %w", n, MaxCandidatePods, ErrInvalid)
	}
	for i, p := range req.GetCandidatePods() {
		if err := checkLen(fmt.Sprintf("candidate_pods[%d]", i), p, MaxPodNameBytes); err != nil {
			return nil, err
		}
	}
	res, err := ix.ScoreByRank(ctx, caller, backend, req.GetModel(), req.GetLoraName(), req.GetBlockHashes(), req.GetTokenIds())
	if err != nil {
		return nil, err
	}
	resp := &pb.ScoreResponse{QueryBlocks: res.QueryBlocks, BlockSize: res.BlockSize}
	best := map[string]*pb.PodScore{}
	for _, m := range res.Matches {
		if len(req.GetCandidatePods()) > 0 && !slices.Contains(req.GetCandidatePods(), m.Pod) {
			continue
		}
		ps := &pb.PodScore{
			PodName: m.Pod, PodUid: m.PodUID, Rank: m.Rank, MatchedBlocks: m.Any, MatchedTokens: uint64(m.Any) * uint64(m.BlockSize),
			Tiers: &pb.TierMatch{Gpu: m.GPU, Cpu: m.GPUOrCPU, Disk: m.Any}, State: m.State,
		}
		if cur, ok := best[m.PodUID]; !ok || betterScore(ps, cur) {
			best[m.PodUID] = ps
		}
	}
	for _, ps := range best {
		resp.Pods = append(resp.Pods, ps)
	}
	slices.SortFunc(resp.Pods, func(a, b *pb.PodScore) int {
		if betterScore(a, b) {
			return -1
		}
		if betterScore(b, a) {
			return 1
		}
		return cmp.Compare(a.PodName, b.PodName)
	})
	if l := int(req.GetLimit()); l > 0 && len(resp.Pods) > l {
		resp.Pods = resp.Pods[:l]
	}
	ix.opt.Observer.Scored(time.Since(start))
	return resp, nil
}

func betterScore(a, b *pb.PodScore) bool {
	if a.MatchedBlocks != b.MatchedBlocks {
		return a.MatchedBlocks > b.MatchedBlocks
	}
	if a.Tiers.Gpu != b.Tiers.Gpu {
		return a.Tiers.Gpu > b.Tiers.Gpu
	}
	return a.Tiers.Cpu > b.Tiers.Cpu
}

func schemeParts(scheme string) (alg, seed string) {
	parts := strings.SplitN(scheme, "/", 3)
	if len(parts) != 3 {
		return scheme, ""
	}
	return parts[0], parts[2]
}

// RankScores is the answer of ScoreByRank.
type RankScores struct {
	Matches     []RankMatch
	QueryBlocks uint32
	BlockSize   uint32
}

// ScoreByRank returns every (pod, rank) of the backend serving model that
// holds at least the prompt's first block, with its prefix lengths; the
// Mooncake-shaped HTTP API reports them per rank and medium. The prompt is
// block hashes, or token IDs that the index hashes with the pods' scheme
// when that scheme is a Verified sha256_cbor or sglang_sha256, and with the scheme of the
// pods' LMCache chunks when their subscribers verified one (scoreTiers).
// Pods reported Unsynced are left out: their blocks are not trusted.
func (ix *Index) ScoreByRank(ctx context.Context, caller Caller, backend BackendRef, model, lora string, hashes []uint64, tokens []uint32) (RankScores, error) {
	var res RankScores
	if backend.Namespace == "" || backend.Name == "" || model == "" {
		return res, fmt.Errorf("a query names a cache backend and a model: %w", ErrInvalid)
	}
	if err := checkBackend(backend); err != nil {
		return res, err
	}
	if err := checkLen("model", model, MaxModelBytes); err != nil {
		return res, err
	}
	if err := checkLen("lora_name", lora, MaxLoraBytes); err != nil {
		return res, err
	}
	if err := checkPrompt(hashes, tokens); err != nil {
		return res, err
	}
	if err := ix.opt.Policy.AuthorizeRead(caller, backend); err != nil {
		ix.opt.Observer.Refused("query")
		return res, err
	}
	recs, err := ix.opt.Store.Pods(ctx, backend)
	if err != nil {
		return res, fmt.Errorf("listing pods of %s: %w", backend, err)
	}
	now := ix.opt.Now()
	pods := map[string]PodRecord{}
	schemes := map[string]PodRecord{}
	for _, r := range recs {
		if r.Model != model {
			continue
		}
		pods[r.UID] = r
		if _, ok := schemes[r.Scheme]; !ok || r.Compatibility == int32(pb.HashCompatibility_HASH_COMPATIBILITY_VERIFIED) {
			schemes[r.Scheme] = r
		}
	}
	hashedTokens := false
	for _, scheme := range slices.Sorted(maps.Keys(schemes)) {
		rep := schemes[scheme]
		hs := hashes
		if len(hs) == 0 && len(tokens) > 0 {
			if rep.Compatibility != int32(pb.HashCompatibility_HASH_COMPATIBILITY_VERIFIED) || lora != "" {
				continue
			}
			alg, seed := schemeParts(scheme)
			if hs, err = HashPrompt(alg, seed, int(rep.BlockSize), tokens); err != nil {
				continue
			}
			hashedTokens = true
		}
		res.QueryBlocks = max(res.QueryBlocks, uint32(len(hs)))
		res.BlockSize = rep.BlockSize
		ms, err := ix.opt.Store.Score(ctx, backend, Space{Model: model, Lora: lora, Scheme: scheme}, hs)
		if err != nil {
			return res, fmt.Errorf("scoring in %s: %w", backend, err)
		}
		for _, m := range ms {
			rec, ok := pods[m.PodUID]
			if !ok || m.Any == 0 {
				continue
			}
			state := ix.podState(rec, 1, now)
			if state == pb.PodState_POD_STATE_UNSYNCED {
				continue
			}
			res.Matches = append(res.Matches, RankMatch{Pod: rec.Name, BlockSize: rec.BlockSize, State: state, Match: m})
		}
	}
	if len(hashes) == 0 && len(tokens) > 0 && lora == "" {
		tiered, err := ix.scoreTiers(ctx, backend, model, tokens, pods, now, &res)
		if err != nil {
			return res, err
		}
		hashedTokens = hashedTokens || tiered
	}
	if len(hashes) == 0 && len(tokens) > 0 && len(schemes) > 0 && !hashedTokens {
		return res, fmt.Errorf("no pod of model %s in %s has a Verified sha256_cbor or sglang_sha256 scheme or LMCache chunks for the base model: %w", model, backend, ErrTokensUnsupported)
	}
	return res, nil
}

// scoreTiers adds the pods' other tiers to a token query's matches: the
// LMCache chunks a pod's subscriber verified live in their own scheme's
// space (their own chunk size and hash), so the index hashes the tokens
// again in that scheme. A rank's chunk prefix counts in the pod's own
// blocks (LMCache's connector requires the chunk size to be a multiple of
// the block size) and merges with the rank's match in the engine's
// scheme: the pod holds at least the longer of the two. A pod whose block
// size is not known yet is left out. It reports
// whether any tier scheme hashed the tokens.
func (ix *Index) scoreTiers(ctx context.Context, backend BackendRef, model string, tokens []uint32, pods map[string]PodRecord, now time.Time, res *RankScores) (bool, error) {
	tiers := map[string]uint32{}
	for _, r := range pods {
		if r.TierScheme != "" && r.ChunkSize > 0 {
			tiers[r.TierScheme] = r.ChunkSize
		}
	}
	if len(tiers) == 0 {
		return false, nil
	}
	type rankKey struct {
		uid  string
		rank uint32
	}
	at := map[rankKey]int{}
	for i, m := range res.Matches {
		at[rankKey{m.PodUID, m.Rank}] = i
	}
	hashed := false
	for _, scheme := range slices.Sorted(maps.Keys(tiers)) {
		alg, _ := schemeParts(scheme)
		hs, err := HashPrompt(alg, "", int(tiers[scheme]), tokens)
		if err != nil || len(hs) == 0 {
			continue
		}
		hashed = true
		ms, err := ix.opt.Store.Score(ctx, backend, Space{Model: model, Scheme: scheme}, hs)
		if err != nil {
			return hashed, fmt.Errorf("scoring in %s: %w", backend, err)
		}
		for _, m := range ms {
			rec, ok := pods[m.PodUID]
			// A known block size divides the chunk (checkTierScheme); an
			// unknown one gives no blocks to count the chunks in.
			if !ok || m.Any == 0 || rec.TierScheme != scheme || rec.BlockSize == 0 {
				continue
			}
			state := ix.podState(rec, 1, now)
			if state == pb.PodState_POD_STATE_UNSYNCED {
				continue
			}
			k := rec.ChunkSize / rec.BlockSize
			c := Match{PodUID: m.PodUID, Rank: m.Rank, Any: m.Any * k, CPU: m.CPU * k, Disk: m.Disk * k, GPUOrCPU: m.GPUOrCPU * k}
			i, ok := at[rankKey{m.PodUID, m.Rank}]
			if !ok {
				at[rankKey{m.PodUID, m.Rank}] = len(res.Matches)
				res.Matches = append(res.Matches, RankMatch{Pod: rec.Name, BlockSize: rec.BlockSize, State: state, Match: c})
				continue
			}
			e := &res.Matches[i].Match
			e.Any, e.CPU, e.Disk, e.GPUOrCPU = max(e.Any, c.Any), max(e.CPU, c.CPU), max(e.Disk, c.Disk), max(e.GPUOrCPU, c.GPUOrCPU)
		}
	}
	return hashed, nil
}

// RankMatch is one (pod, rank)'s match with the pod's name and state.
type RankMatch struct {
	Pod       string
	BlockSize uint32
	State     pb.PodState
	Match
}
