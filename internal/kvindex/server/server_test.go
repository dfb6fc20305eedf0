package server_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/memstore"
	"github.com/inferencecache/operator/internal/kvindex/server"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// audience is the one the webhook's projected token carries.
const audience = v1alpha1.IndexTokenAudience

// fakeReviewer answers TokenReviews from a token → username table, and
// counts the reviews it was asked for.
type fakeReviewer struct {
	mu    sync.Mutex
	users map[string]string
	extra map[string]map[string]authnv1.ExtraValue
	calls int
}

func (f *fakeReviewer) Create(_ context.Context, tr *authnv1.TokenReview, _ metav1.CreateOptions) (*authnv1.TokenReview, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	out := tr.DeepCopy()
	name := nameOf(tr.Spec.Token)
	user, ok := f.users[name]
	if !ok {
		out.Status = authnv1.TokenReviewStatus{Authenticated: false, Error: "invalid bearer token"}
		return out, nil
	}
	out.Status = authnv1.TokenReviewStatus{Authenticated: true, Audiences: []string{audience},
		User: authnv1.UserInfo{Username: user, Extra: f.extra[name]}}
	return out, nil
}

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

type harness struct {
	ix       *kvindex.Index
	store    kvindex.Store
	clock    *clock
	reviewer *fakeReviewer
	conn     *grpc.ClientConn
	http     *httptest.Server
}

func newHarness(t *testing.T, store kvindex.Store) *harness {
	t.Helper()
	h := &harness{store: store, clock: &clock{now: time.Unix(1_800_000_000, 0)}, reviewer: &fakeReviewer{
		users: map[string]string{
			"sub-a":    "system:serviceaccount:team-a:vllm",
			"sub-b":    "system:serviceaccount:team-b:vllm",
			"router-a": "system:serviceaccount:team-a:router",
			"router-b": "system:serviceaccount:team-b:router",
			"operator": "system:serviceaccount:inferencecache-system:manager",
			"bound":    "system:serviceaccount:team-a:vllm",
			"sub-sg":   "system:serviceaccount:team-a:sglang",
			"unbound":  "system:serviceaccount:team-a:vllm",
		},
		// Subscribers' tokens are bound to their pods, as the projected
		// token the webhook mounts is.
		extra: map[string]map[string]authnv1.ExtraValue{
			"sub-a":  boundTo("vllm-0", "uid-0"),
			"sub-b":  boundTo("vllm-0", "uid-0"),
			"bound":  boundTo("vllm-0", "uid-0"),
			"sub-sg": boundTo("sg-0", "uid-sg"),
		},
	}}
	h.ix = kvindex.New(kvindex.Options{
		Store:         store,
		Authenticator: &server.TokenReviewAuthenticator{Reviewer: h.reviewer, Audiences: []string{audience}, CacheTTL: time.Minute, Now: h.clock.Now},
		Policy:        kvindex.Policy{ClusterReaders: []string{"system:serviceaccount:inferencecache-system:manager"}},
		Lease:         time.Minute,
		Heartbeat:     10 * time.Second,
		Now:           h.clock.Now,
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	server.RegisterGRPC(srv, h.ix)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	h.conn, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.conn.Close() })
	mux := http.NewServeMux()
	server.HTTPHandler(h.ix, mux)
	h.http = httptest.NewServer(mux)
	t.Cleanup(h.http.Close)
	return h
}

// jwt is the token of the caller name, shaped like the JWTs the API
// server issues (the authenticator refuses anything else unreviewed).
func jwt(name string) string {
	if name == "" {
		return ""
	}
	return "eyJhbGciOiJSUzI1NiJ9." + base64.RawURLEncoding.EncodeToString([]byte(name)) + ".c2lnbmF0dXJl"
}

// nameOf is the caller name jwt wrapped in token ("" for another token).
func nameOf(token string) string {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return ""
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return ""
	}
	return string(b)
}

// boundTo is the extra a TokenReview reports for a token bound to a pod.
func boundTo(pod, uid string) map[string]authnv1.ExtraValue {
	return map[string]authnv1.ExtraValue{"authentication.kubernetes.io/pod-name": {pod}, "authentication.kubernetes.io/pod-uid": {uid}}
}

func withToken(token string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+jwt(token))
}

type stream struct {
	t *testing.T
	s pb.Ingest_StreamClient
}

func (h *harness) open(t *testing.T, token string) *stream {
	t.Helper()
	ctx, cancel := context.WithCancel(withToken(token))
	t.Cleanup(cancel)
	s, err := pb.NewIngestClient(h.conn).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &stream{t: t, s: s}
}

func (s *stream) send(m *pb.IngestRequest) {
	s.t.Helper()
	if err := s.s.Send(m); err != nil {
		s.t.Fatalf("send: %v", err)
	}
}

func (s *stream) recv() *pb.IngestResponse {
	s.t.Helper()
	m, err := s.s.Recv()
	if err != nil {
		s.t.Fatalf("recv: %v", err)
	}
	return m
}

func hello(ns, pod, uid string, dp uint32, ranks ...*pb.RankPosition) *pb.IngestRequest {
	return &pb.IngestRequest{Message: &pb.IngestRequest_Hello{Hello: &pb.Hello{
		ProtocolVersion: 1,
		Pod:             &pb.PodIdentity{Namespace: ns, Name: pod, Uid: uid},
		CacheBackend:    &pb.CacheBackendRef{Namespace: ns, Name: "cache"},
		Model:           "m", Engine: "vllm",
		HashScheme:        &pb.HashScheme{Algorithm: "sha256_cbor", Seed: "vllm-none-hash", BlockSize: 4},
		HashCompatibility: pb.HashCompatibility_HASH_COMPATIBILITY_VERIFIED,
		DataParallelSize:  dp, Ranks: ranks,
	}}}
}

func delta(rank uint32, epoch, seq uint64, events ...*pb.BlockEvent) *pb.IngestRequest {
	return &pb.IngestRequest{Message: &pb.IngestRequest_Delta{Delta: &pb.Delta{Rank: rank, Epoch: epoch, Sequence: seq, Events: events}}}
}

func stored(tier pb.Tier, hashes ...uint64) *pb.BlockEvent {
	return &pb.BlockEvent{Event: &pb.BlockEvent_Stored{Stored: &pb.BlockStored{BlockHashes: hashes, Tier: tier, BlockSize: 4}}}
}

func removed(tier pb.Tier, hashes ...uint64) *pb.BlockEvent {
	return &pb.BlockEvent{Event: &pb.BlockEvent_Removed{Removed: &pb.BlockRemoved{BlockHashes: hashes, Tier: tier}}}
}

func score(t *testing.T, h *harness, token, ns string, hashes ...uint64) (*pb.ScoreResponse, error) {
	t.Helper()
	return pb.NewQueryClient(h.conn).Score(withToken(token), &pb.ScoreRequest{
		CacheBackend: &pb.CacheBackendRef{Namespace: ns, Name: "cache"}, Model: "m", BlockHashes: hashes,
	})
}

func TestIngestExactlyOnceGapSnapshotAndScore(t *testing.T) {
	h := newHarness(t, memstore.New())
	s := h.open(t, "sub-a")
	s.send(hello("team-a", "vllm-0", "uid-0", 1, &pb.RankPosition{Rank: 0, Epoch: 1}))
	w := s.recv().GetWelcome()
	if w == nil || w.GetLeaseSeconds() != 60 || len(w.GetApplied()) != 0 {
		t.Fatalf("welcome = %v", w)
	}
	steps := []struct {
		name string
		send *pb.IngestRequest
		want string // "ack e/s", "resync REASON"
	}{
		{"first delta", delta(0, 1, 1, stored(pb.Tier_TIER_GPU, 1, 2, 3)), "ack 1/1"},
		{"next delta", delta(0, 1, 2, stored(pb.Tier_TIER_CPU, 4)), "ack 1/2"},
		{"resent delta is acked, not applied", delta(0, 1, 2, stored(pb.Tier_TIER_CPU, 4)), "ack 1/2"},
		{"removal", delta(0, 1, 3, removed(pb.Tier_TIER_GPU, 3)), "ack 1/3"},
		{"gap", delta(0, 1, 5, stored(pb.Tier_TIER_GPU, 9)), "resync RESYNC_REASON_GAP"},
	}
	for _, st := range steps {
		s.send(st.send)
		m := s.recv()
		var got string
		switch {
		case m.GetAck() != nil:
			got = "ack " + itoa(m.GetAck().GetApplied().GetEpoch()) + "/" + itoa(m.GetAck().GetApplied().GetSequence())
		case m.GetResync() != nil:
			got = "resync " + m.GetResync().GetReason().String()
		}
		if got != st.want {
			t.Fatalf("%s: got %q, want %q", st.name, got, st.want)
		}
	}
	resp, err := score(t, h, "router-a", "team-a", 1, 2, 3, 4)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetPods()) != 1 || resp.GetPods()[0].GetMatchedBlocks() != 2 || resp.GetPods()[0].GetMatchedTokens() != 8 || resp.GetPods()[0].GetPodName() != "vllm-0" {
		t.Fatalf("score before the snapshot = %v, want vllm-0 with 2 blocks (block 3 removed, resend not applied twice)", resp)
	}
	// While the snapshot is awaited, the pod is Replaying.
	sum, err := pb.NewQueryClient(h.conn).Participation(withToken("operator"), &pb.ParticipationRequest{CacheBackend: &pb.CacheBackendRef{Namespace: "team-a", Name: "cache"}})
	if err != nil {
		t.Fatal(err)
	}
	if sum.GetReplayingPods() != 1 || sum.GetPods() != 1 {
		t.Fatalf("participation while awaiting a snapshot = %v", sum)
	}
	// Snapshot at sequence 7; then 8 applies.
	s.send(&pb.IngestRequest{Message: &pb.IngestRequest_SnapshotBegin{SnapshotBegin: &pb.SnapshotBegin{Rank: 0, Epoch: 1, Sequence: 7, BlockCount: 3}}})
	s.send(&pb.IngestRequest{Message: &pb.IngestRequest_SnapshotChunk{SnapshotChunk: &pb.SnapshotChunk{Rank: 0, Epoch: 1, Entries: []*pb.SnapshotEntries{
		{Tier: pb.Tier_TIER_GPU, BlockHashes: []uint64{1, 2, 3}},
	}}}})
	s.send(&pb.IngestRequest{Message: &pb.IngestRequest_SnapshotEnd{SnapshotEnd: &pb.SnapshotEnd{Rank: 0, Epoch: 1, Sequence: 7, BlockCount: 3}}})
	if a := s.recv().GetAck(); a.GetApplied().GetSequence() != 7 {
		t.Fatalf("snapshot end answered %v, want ack 7", a)
	}
	s.send(delta(0, 1, 8, stored(pb.Tier_TIER_GPU, 4)))
	if a := s.recv().GetAck(); a.GetApplied().GetSequence() != 8 {
		t.Fatalf("delta after snapshot answered %v", a)
	}
	resp, err = score(t, h, "router-a", "team-a", 1, 2, 3, 4)
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetPods()[0]; got.GetMatchedBlocks() != 4 || got.GetTiers().GetGpu() != 4 {
		t.Fatalf("score after snapshot = %v, want 4 GPU blocks", got)
	}
	s.send(&pb.IngestRequest{Message: &pb.IngestRequest_Heartbeat{Heartbeat: &pb.Heartbeat{Ranks: []*pb.RankHealth{{Rank: 0, State: pb.PodState_POD_STATE_LIVE, SequenceGaps: 1, LagP50Millis: 3, LagP99Millis: 9}}}}})
	waitFor(t, func() bool {
		sum, err = pb.NewQueryClient(h.conn).Participation(withToken("operator"), &pb.ParticipationRequest{CacheBackend: &pb.CacheBackendRef{Namespace: "team-a", Name: "cache"}})
		return err == nil && sum.GetLivePods() == 1 && sum.GetLagP99Millis() == 9
	})
	if sum.GetResyncs() != 1 || sum.GetLagP99Millis() != 9 || sum.GetSequenceGaps() != 1 || sum.GetBlocks()[0].GetBlocks() != 4 ||
		sum.GetHashCompatibility() != pb.HashCompatibility_HASH_COMPATIBILITY_VERIFIED || sum.GetHashScheme() != "sha256_cbor/4/vllm-none-hash" {
		t.Fatalf("participation = %v", sum)
	}
	// The pod goes silent: Stale after 3 heartbeats, removed after the lease.
	h.clock.Add(45 * time.Second)
	sum, _ = pb.NewQueryClient(h.conn).Participation(withToken("operator"), &pb.ParticipationRequest{CacheBackend: &pb.CacheBackendRef{Namespace: "team-a", Name: "cache"}})
	if sum.GetStalePods() != 1 || sum.GetPodList()[0].GetState() != pb.PodState_POD_STATE_STALE {
		t.Fatalf("participation after 45s of silence = %v", sum)
	}
	h.clock.Add(30 * time.Second)
	if n, err := h.ix.ExpireLeases(context.Background()); err != nil || n != 1 {
		t.Fatalf("expire leases: %d, %v", n, err)
	}
	if resp, _ := score(t, h, "router-a", "team-a", 1); len(resp.GetPods()) != 0 {
		t.Fatalf("expired pod still scores: %v", resp)
	}
}

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	for range 200 {
		if ok() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("condition not met")
}

func TestIndexRestartAsksForSnapshots(t *testing.T) {
	tests := []struct {
		name  string
		ranks []*pb.RankPosition
		want  []string
	}{
		{"fresh pod, nothing sent", []*pb.RankPosition{{Rank: 0, Epoch: 1}, {Rank: 1, Epoch: 1}}, nil},
		{"index lost rank 1's state", []*pb.RankPosition{{Rank: 0, Epoch: 1}, {Rank: 1, Epoch: 2, Sequence: 30}}, []string{"1 RESYNC_REASON_UNKNOWN_RANK"}},
		{"no positions given", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, memstore.New())
			s := h.open(t, "sub-a")
			s.send(hello("team-a", "vllm-0", "uid-0", 2, tt.ranks...))
			if s.recv().GetWelcome() == nil {
				t.Fatal("no welcome")
			}
			var got []string
			for range tt.want {
				r := s.recv().GetResync()
				got = append(got, itoa(uint64(r.GetRank()))+" "+r.GetReason().String())
			}
			// Nothing else is pending: a heartbeat-free delta gets its ack next.
			s.send(delta(0, 1, 1, stored(pb.Tier_TIER_GPU, 1)))
			if a := s.recv().GetAck(); a == nil {
				t.Fatalf("expected the ack of rank 0's first delta after %v", got)
			}
			if strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Fatalf("resyncs = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestRefusedCallers(t *testing.T) {
	h := newHarness(t, memstore.New())
	// A team-a pod publishes.
	s := h.open(t, "sub-a")
	s.send(hello("team-a", "vllm-0", "uid-0", 1))
	s.recv()
	s.send(delta(0, 1, 1, stored(pb.Tier_TIER_GPU, 1, 2)))
	s.recv()

	ingest := []struct {
		name  string
		token string
		hello *pb.IngestRequest
		code  codes.Code
	}{
		{"token from another namespace", "sub-b", hello("team-a", "vllm-0", "uid-0", 1), codes.PermissionDenied},
		{"backend of another namespace", "sub-a", func() *pb.IngestRequest {
			m := hello("team-a", "vllm-0", "uid-0", 1)
			m.GetHello().CacheBackend.Namespace = "team-b"
			return m
		}(), codes.InvalidArgument},
		{"token bound to another pod", "bound", hello("team-a", "vllm-1", "uid-1", 1), codes.PermissionDenied},
		{"token bound to no pod", "unbound", hello("team-a", "vllm-0", "uid-0", 1), codes.PermissionDenied},
		{"invalid token", "nope", hello("team-a", "vllm-0", "uid-0", 1), codes.Unauthenticated},
		{"no token", "", hello("team-a", "vllm-0", "uid-0", 1), codes.Unauthenticated},
	}
	for _, tt := range ingest {
		t.Run("ingest/"+tt.name, func(t *testing.T) {
			st := h.open(t, tt.token)
			_ = st.s.Send(tt.hello)
			_, err := st.s.Recv()
			if status.Code(err) != tt.code {
				t.Fatalf("got %v, want %s", err, tt.code)
			}
		})
	}
	query := []struct {
		name  string
		token string
		ns    string
		code  codes.Code
	}{
		{"own namespace", "router-a", "team-a", codes.OK},
		{"another namespace's backend", "router-b", "team-a", codes.PermissionDenied},
		{"cluster reader", "operator", "team-a", codes.OK},
		{"invalid token", "nope", "team-a", codes.Unauthenticated},
	}
	for _, tt := range query {
		t.Run("query/"+tt.name, func(t *testing.T) {
			resp, err := score(t, h, tt.token, tt.ns, 1, 2)
			if status.Code(err) != tt.code {
				t.Fatalf("got %v, want %s", err, tt.code)
			}
			if tt.code == codes.OK && len(resp.GetPods()) != 1 {
				t.Fatalf("allowed query answered %v", resp)
			}
		})
	}
	// team-b's own backend never sees team-a's blocks.
	resp, err := score(t, h, "router-b", "team-b", 1, 2)
	if err != nil || len(resp.GetPods()) != 0 {
		t.Fatalf("team-b query of its own backend: %v, %v", resp, err)
	}
	// HTTP: same rule, 403.
	body := `{"model":"m","tenant_id":"team-a/cache","seq_hashes":[1,2]}`
	if code := postJSON(t, h, "/query_by_hash", "router-b", body, nil); code != http.StatusForbidden {
		t.Fatalf("HTTP query for another backend: %d, want 403", code)
	}
	if code := postJSON(t, h, "/query_by_hash", "", body, nil); code != http.StatusUnauthorized {
		t.Fatalf("HTTP query without a token: %d, want 401", code)
	}
}

func TestTokenReviewsAreCached(t *testing.T) {
	h := newHarness(t, memstore.New())
	for range 5 {
		if _, err := score(t, h, "router-a", "team-a", 1); err != nil {
			t.Fatal(err)
		}
	}
	if h.reviewer.calls != 1 {
		t.Fatalf("5 queries with one token cost %d TokenReviews, want 1", h.reviewer.calls)
	}
	h.clock.Add(2 * time.Minute)
	_, _ = score(t, h, "router-a", "team-a", 1)
	if h.reviewer.calls != 2 {
		t.Fatalf("after the cache TTL: %d reviews, want 2", h.reviewer.calls)
	}
}

func postJSON(t *testing.T, h *harness, path, token, body string, out any) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, h.http.URL+path, bytes.NewBufferString(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+jwt(token))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil && resp.StatusCode == http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode
}

func TestMooncakeShapedQuery(t *testing.T) {
	h := newHarness(t, memstore.New())
	tokens := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	hashes, err := kvindex.HashTokens("sha256_cbor", "vllm-none-hash", 4, tokens)
	if err != nil {
		t.Fatal(err)
	}
	s := h.open(t, "sub-a")
	s.send(hello("team-a", "vllm-0", "uid-0", 2))
	s.recv()
	s.send(delta(0, 1, 1, stored(pb.Tier_TIER_GPU, hashes[:2]...), stored(pb.Tier_TIER_CPU, hashes...)))
	s.recv()
	s.send(delta(1, 1, 1, stored(pb.Tier_TIER_GPU, hashes[:1]...)))
	s.recv()
	type inst struct {
		LongestMatched uint64            `json:"longest_matched"`
		GPU            uint64            `json:"GPU"`
		CPU            uint64            `json:"CPU"`
		DISK           uint64            `json:"DISK"`
		DP             map[string]uint64 `json:"DP"`
	}
	want := inst{LongestMatched: 12, GPU: 8, CPU: 12, DP: map[string]uint64{"0": 12, "1": 4}}
	for _, q := range []struct{ path, body string }{
		{"/query", `{"model":"m","tenant_id":"team-a/cache","block_size":4,"token_ids":[1,2,3,4,5,6,7,8,9,10,11,12,13]}`},
		{"/v1/query_by_hash", `{"model":"m","tenant_id":"team-a/cache","seq_hashes":[` + itoa(hashes[0]) + `,` + itoa(hashes[1]) + `,` + itoa(hashes[2]) + `]}`},
	} {
		var got map[string]map[string]inst
		if code := postJSON(t, h, q.path, "router-a", q.body, &got); code != http.StatusOK {
			t.Fatalf("%s: HTTP %d", q.path, code)
		}
		g := got["team-a/cache"]["vllm-0"]
		if g.LongestMatched != want.LongestMatched || g.GPU != want.GPU || g.CPU != want.CPU || g.DISK != 0 || g.DP["0"] != 12 || g.DP["1"] != 4 {
			t.Fatalf("%s: got %+v, want %+v", q.path, g, want)
		}
	}
	// Token IDs need a Verified scheme the index can hash with.
	s2 := h.open(t, "sub-sg")
	m := hello("team-a", "sg-0", "uid-sg", 1)
	m.GetHello().Model = "sg"
	m.GetHello().HashScheme.Algorithm = "sglang_sha256"
	m.GetHello().HashCompatibility = pb.HashCompatibility_HASH_COMPATIBILITY_UNVERIFIABLE
	s2.send(m)
	s2.recv()
	if code := postJSON(t, h, "/query", "router-a", `{"model":"sg","tenant_id":"team-a/cache","token_ids":[1,2,3,4]}`, nil); code != http.StatusUnprocessableEntity {
		t.Fatalf("token query for an unverifiable scheme: %d, want 422", code)
	}
}

func TestNewerStreamReplacesOlder(t *testing.T) {
	h := newHarness(t, memstore.New())
	old := h.open(t, "sub-a")
	old.send(hello("team-a", "vllm-0", "uid-0", 1))
	old.recv()
	nw := h.open(t, "sub-a")
	nw.send(hello("team-a", "vllm-0", "uid-0", 1))
	nw.recv()
	_, err := old.s.Recv()
	if status.Code(err) != codes.Aborted {
		t.Fatalf("older stream ended with %v, want Aborted", err)
	}
}

// A delta past the pod's block limit ends the stream with
// ResourceExhausted naming the scope and the limit; nothing was applied,
// so the subscriber's resend on a new stream continues from the same
// position.
func TestOverLimitDeltaEndsTheStreamResourceExhausted(t *testing.T) {
	h := newHarness(t, memstore.NewLimited(kvindex.Limits{PodBlocks: 3}))
	s := h.open(t, "sub-a")
	s.send(hello("team-a", "vllm-0", "uid-0", 1))
	s.recv()
	s.send(delta(0, 1, 1, stored(pb.Tier_TIER_GPU, 1, 2)))
	if a := s.recv().GetAck(); a.GetApplied().GetSequence() != 1 {
		t.Fatalf("first delta: ack %v", a)
	}
	s.send(delta(0, 1, 2, stored(pb.Tier_TIER_GPU, 3, 4)))
	_, err := s.s.Recv()
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "pod block limit 3") {
		t.Fatalf("over the limit: %v, want ResourceExhausted naming the pod block limit 3", err)
	}
	s = h.open(t, "sub-a")
	s.send(hello("team-a", "vllm-0", "uid-0", 1, &pb.RankPosition{Rank: 0, Epoch: 1, Sequence: 2}))
	if w := s.recv().GetWelcome(); len(w.GetApplied()) != 1 || w.GetApplied()[0].GetSequence() != 1 {
		t.Fatalf("welcome after the refusal: %v, want rank 0 at sequence 1", w)
	}
	s.send(delta(0, 1, 2, stored(pb.Tier_TIER_GPU, 3)))
	if a := s.recv().GetAck(); a.GetApplied().GetSequence() != 2 {
		t.Fatalf("resend within the limit: ack %v", a)
	}
}
