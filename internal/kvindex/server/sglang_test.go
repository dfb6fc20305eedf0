package server_test

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/memstore"
	"github.com/inferencecache/operator/internal/kvindex/server"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
	"github.com/inferencecache/operator/internal/sglangpb"
)

// sglangRouter serves SGLang's router query for backend from h's index and
// returns a client of it, as the router's --kv-indexer-endpoint reaches it.
func sglangRouter(t *testing.T, h *harness, backend kvindex.BackendRef) sglangpb.KVIndexerClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(server.GRPCOptions()...)
	server.RegisterSGLang(srv, h.ix, backend)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return sglangpb.NewKVIndexerClient(conn)
}

func sglangHello(pod, uid, address string, dp uint32) *pb.IngestRequest {
	m := hello("team-a", pod, uid, dp)
	m.GetHello().Engine = "sglang"
	m.GetHello().HashScheme = &pb.HashScheme{Algorithm: "sglang_sha256", BlockSize: 4}
	m.GetHello().WorkerAddress = address
	return m
}

// The answer to SGLang's router: per pod that publishes SGLang's page
// hashes and has a router-facing address, its leading pages in GPU or CPU
// (ranks merged, disk left out), longest first; pods without an address,
// pods of another hash scheme and other backends are not in it; signed
// hashes keep their bit pattern; max_blocks and the empty query.
func TestSGLangRouterQuery(t *testing.T) {
	h := newHarness(t, memstore.New())
	h.reviewer.users["sub-sg1"] = "system:serviceaccount:team-a:sglang"
	h.reviewer.extra["sub-sg1"] = boundTo("sg-1", "uid-sg1")
	// Hashes with the top bit set: SGLang sends them as negative int64.
	a, b, c, d, e, f := uint64(1<<63|1), uint64(2), uint64(1<<63|3), uint64(4), uint64(5), uint64(6)

	sg := h.open(t, "sub-sg")
	sg.send(sglangHello("sg-0", "uid-sg", "http://10.0.0.1:30000", 2))
	sg.recv()
	sg.send(delta(0, 1, 1, stored(pb.Tier_TIER_GPU, a, b, c)))
	sg.recv()
	sg.send(delta(1, 1, 1, stored(pb.Tier_TIER_CPU, a, b, c, d), stored(pb.Tier_TIER_DISK, e)))
	sg.recv()
	// A second SGLang pod whose subscriber named no address.
	sg1 := h.open(t, "sub-sg1")
	sg1.send(sglangHello("sg-1", "uid-sg1", "", 1))
	sg1.recv()
	sg1.send(delta(0, 1, 1, stored(pb.Tier_TIER_GPU, a, b, c, d, e)))
	sg1.recv()
	// A vLLM pod holding the same numbers in its own scheme.
	v := h.open(t, "sub-a")
	m := hello("team-a", "vllm-0", "uid-0", 1)
	m.GetHello().WorkerAddress = "http://10.0.0.2:8000"
	v.send(m)
	v.recv()
	v.send(delta(0, 1, 1, stored(pb.Tier_TIER_GPU, a, b, c, d, e, f)))
	v.recv()

	router := sglangRouter(t, h, kvindex.BackendRef{Namespace: "team-a", Name: "cache"})
	query := func(maxBlocks uint32, hs ...uint64) (*sglangpb.MatchExternalKvPrefixResponse, error) {
		req := &sglangpb.MatchExternalKvPrefixRequest{MaxBlocks: maxBlocks}
		for _, x := range hs {
			req.Hashes = append(req.Hashes, int64(x))
		}
		return router.MatchExternalKvPrefix(context.Background(), req)
	}
	for _, tc := range []struct {
		name      string
		maxBlocks uint32
		hashes    []uint64
		want      uint32
		read      uint32
	}{
		{"the whole prompt: rank 1's CPU pages, not its disk page", 0, []uint64{a, b, c, d, e, f}, 4, 6},
		{"max_blocks cuts the prompt", 2, []uint64{a, b, c, d, e, f}, 2, 2},
		{"a first page only the vLLM pod holds matches nothing", 0, []uint64{f, a, b}, 0, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := query(tc.maxBlocks, tc.hashes...)
			if err != nil {
				t.Fatal(err)
			}
			if r.GetBlocksRead() != tc.read || r.GetBestPrefixBlocks() != tc.want {
				t.Errorf("best %d, read %d; want %d, %d", r.GetBestPrefixBlocks(), r.GetBlocksRead(), tc.want, tc.read)
			}
			if tc.want == 0 {
				if len(r.GetMatches()) != 0 {
					t.Errorf("matches %v, want none", r.GetMatches())
				}
				return
			}
			if len(r.GetMatches()) != 1 {
				t.Fatalf("matches %v, want sg-0 alone", r.GetMatches())
			}
			got := r.GetMatches()[0]
			if got.GetWorkerAddress() != "http://10.0.0.1:30000" || got.GetMatchedPrefixBlocks() != tc.want || got.GetWorkerId() != "team-a/sg-0" {
				t.Errorf("match %v, want http://10.0.0.1:30000 (team-a/sg-0) with %d pages", got, tc.want)
			}
		})
	}
	if _, err := query(0); status.Code(err) != codes.InvalidArgument {
		t.Errorf("an empty query: %v, want InvalidArgument", err)
	}
	// A listener bound to a backend with no pods answers no match, not an
	// error (the router fails its pick on errors other than
	// unavailability).
	other := sglangRouter(t, h, kvindex.BackendRef{Namespace: "team-b", Name: "cache"})
	r, err := other.MatchExternalKvPrefix(context.Background(), &sglangpb.MatchExternalKvPrefixRequest{Hashes: []int64{int64(a)}})
	if err != nil || len(r.GetMatches()) != 0 {
		t.Errorf("another backend's listener: %v, %v; want no match", r, err)
	}
}
