// Package indexcluster runs the real cache-index binary, two replicas, on a
// real 3-master Redis Cluster (Debian's redis-server): a subscriber's
// stream into one replica, that replica killed mid-stream, the stream
// resumed on the other; the placements and answers checked on both sides,
// and every master's own statistics read for MOVED, ASK and CROSSSLOT.
package indexcluster_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/inferencecache/operator/internal/kvindexpb"
	"github.com/inferencecache/operator/test/kvevents/fixture"
	"github.com/inferencecache/operator/test/testutil/freeport"
	"github.com/inferencecache/operator/test/testutil/redisserver"
)

// replica is one cache-index process.
type replica struct {
	http string
	conn *grpc.ClientConn
	kill func()
}

func startReplica(t *testing.T, bin string, redisAddrs []string) *replica {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", freeport.MustTake(t))
	ix := fixture.StartCacheIndex(t, bin, addr, "--store=redis", "--redis-address="+strings.Join(redisAddrs, ","), "--heartbeat", "1s")
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &replica{http: ix.HTTP, conn: conn, kill: ix.Kill}
}

var backend = &pb.CacheBackendRef{Namespace: "team-a", Name: "cache"}

func hello(pod int, seq uint64) *pb.IngestRequest {
	return &pb.IngestRequest{Message: &pb.IngestRequest_Hello{Hello: &pb.Hello{
		ProtocolVersion: 1,
		Pod:             &pb.PodIdentity{Namespace: "team-a", Name: fmt.Sprintf("vllm-%d", pod), Uid: fmt.Sprintf("uid-%d", pod)},
		CacheBackend:    backend, Model: "m", Engine: "vllm",
		HashScheme:        &pb.HashScheme{Algorithm: "sha256_cbor", Seed: "vllm-none-hash", BlockSize: 16},
		HashCompatibility: pb.HashCompatibility_HASH_COMPATIBILITY_VERIFIED,
		DataParallelSize:  1, Ranks: []*pb.RankPosition{{Rank: 0, Epoch: 1, Sequence: seq}},
	}}}
}

// blocks is delta seq's 64 block hashes: a chain that continues the
// previous delta's, as one long prompt's.
func blocks(pod int, seq uint64) []uint64 {
	out := make([]uint64, 64)
	for i := range out {
		out[i] = uint64(pod)<<40 | seq<<16 | uint64(i) + 1
	}
	return out
}

// stream sends deltas from..to of one pod on a new stream to r and waits
// for each ack; it returns the Welcome's applied sequence.
func stream(t *testing.T, r *replica, pod int, from, to uint64) uint64 {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := pb.NewIngestClient(r.conn).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(hello(pod, from-1)); err != nil {
		t.Fatal(err)
	}
	m, err := s.Recv()
	if err != nil || m.GetWelcome() == nil {
		t.Fatalf("hello: %v, %v", m, err)
	}
	var applied uint64
	for _, p := range m.GetWelcome().GetApplied() {
		if p.GetRank() == 0 && p.GetEpoch() == 1 {
			applied = p.GetSequence()
		}
	}
	for seq := from; seq <= to; seq++ {
		if seq <= applied {
			continue
		}
		ev := &pb.BlockEvent{Event: &pb.BlockEvent_Stored{Stored: &pb.BlockStored{BlockHashes: blocks(pod, seq), Tier: pb.Tier_TIER_GPU, BlockSize: 16}}}
		if err := s.Send(&pb.IngestRequest{Message: &pb.IngestRequest_Delta{Delta: &pb.Delta{Rank: 0, Epoch: 1, Sequence: seq, Events: []*pb.BlockEvent{ev}}}}); err != nil {
			t.Fatal(err)
		}
		m, err := s.Recv()
		if err != nil || m.GetAck().GetApplied().GetSequence() != seq {
			t.Fatalf("pod %d delta %d: %v, %v", pod, seq, m, err)
		}
	}
	return applied
}

// prompt is pod's deltas 1..n, in order.
func prompt(pod int, n uint64) []uint64 {
	var out []uint64
	for seq := uint64(1); seq <= n; seq++ {
		out = append(out, blocks(pod, seq)...)
	}
	return out
}

// score asks r's gRPC Query for the prompt and returns each pod's matched
// blocks by pod name.
func score(t *testing.T, r *replica, hashes []uint64) map[string]uint32 {
	t.Helper()
	resp, err := pb.NewQueryClient(r.conn).Score(context.Background(), &pb.ScoreRequest{CacheBackend: backend, Model: "m", BlockHashes: hashes})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint32{}
	for _, p := range resp.GetPods() {
		out[p.GetPodName()] = p.GetMatchedBlocks()
	}
	return out
}

// query asks r's HTTP /query_by_hash (Mooncake's shape) and returns each
// instance's longest match in tokens.
func query(t *testing.T, r *replica, hashes []uint64) map[string]uint64 {
	t.Helper()
	hs := make([]string, len(hashes))
	for i, h := range hashes {
		hs[i] = strconv.FormatUint(h, 10)
	}
	body := fmt.Sprintf(`{"model":"m","tenant_id":"team-a/cache","seq_hashes":[%s]}`, strings.Join(hs, ","))
	resp, err := http.Post("http://"+r.http+"/query_by_hash", "application/json", bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]map[string]struct {
		LongestMatched uint64 `json:"longest_matched"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/query_by_hash: %d, %v", resp.StatusCode, err)
	}
	got := map[string]uint64{}
	for inst, m := range out["team-a/cache"] {
		got[inst] = m.LongestMatched
	}
	return got
}

// masterErrors reads a master's error replies by prefix (INFO errorstats)
// and its placement keys of team-a.
func masterErrors(t *testing.T, addr string) (map[string]int64, int) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	defer c.Close()
	info, err := c.Info(context.Background(), "errorstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for line := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "errorstat_") {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimPrefix(rest, "count="), 10, 64)
		out[strings.TrimPrefix(name, "errorstat_")] = n
	}
	keys, err := c.Keys(context.Background(), "kvi2:{*}:blk:team-a/cache:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return out, len(keys)
}

func TestReplicasOnARedisCluster(t *testing.T) {
	addrs := redisserver.StartCluster(t, 3)
	index, _, err := fixture.BuildBinaries(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a, b := startReplica(t, index, addrs), startReplica(t, index, addrs)

	// Four pods stream 30 deltas of 64 blocks each to replica a, except
	// pod 0, whose replica dies after its 15th delta was acked.
	for pod := 1; pod <= 3; pod++ {
		stream(t, a, pod, 1, 30)
	}
	stream(t, a, 0, 1, 15)
	a.kill()

	// Replica b answers at once for everything a acked: no placement
	// lost, no query answered blind.
	if got := score(t, b, prompt(0, 15)); got["vllm-0"] != 15*64 {
		t.Fatalf("after replica a died, b matches pod 0 for %d blocks, want %d (all a acked)", got["vllm-0"], 15*64)
	}
	// The subscriber reconnects to b, saying it sent up to 15: b's
	// Welcome says the rank stands there, and only the rest is sent.
	if applied := stream(t, b, 0, 16, 30); applied != 15 {
		t.Fatalf("b welcomed pod 0 at sequence %d, want 15", applied)
	}
	for pod := range 4 {
		p := prompt(pod, 30)
		got := score(t, b, p)
		if got[fmt.Sprintf("vllm-%d", pod)] != 30*64 || len(got) != 1 {
			t.Fatalf("pod %d's prompt matches %v on b, want vllm-%d with %d blocks", pod, got, pod, 30*64)
		}
		// The Mooncake-shaped HTTP query answers the same, in tokens.
		if q := query(t, b, p); q[fmt.Sprintf("vllm-%d", pod)] != 30*64*16 || len(q) != 1 {
			t.Fatalf("pod %d's prompt on /query_by_hash: %v, want vllm-%d with %d tokens", pod, q, pod, 30*64*16)
		}
	}

	// One namespace's placements on every master; no master answered
	// MOVED, ASK or CROSSSLOT to either replica.
	total := 0
	for i, addr := range addrs {
		errs, placements := masterErrors(t, addr)
		t.Logf("master %d: %d placements, errors %v", i, placements, errs)
		if placements == 0 {
			t.Errorf("master %d holds none of team-a's placements", i)
		}
		for _, bad := range []string{"MOVED", "ASK", "CROSSSLOT"} {
			if errs[bad] != 0 {
				t.Errorf("master %d answered %s %d times", i, bad, errs[bad])
			}
		}
		total += placements
	}
	if total != 4*30*64 {
		t.Errorf("%d placements on the masters, want %d", total, 4*30*64)
	}
}
