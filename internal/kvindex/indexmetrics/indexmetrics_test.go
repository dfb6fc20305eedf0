package indexmetrics_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/indexmetrics"
	"github.com/inferencecache/operator/internal/kvindex/memstore"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

func delta(seq uint64, hashes ...uint64) *pb.IngestRequest {
	return &pb.IngestRequest{Message: &pb.IngestRequest_Delta{Delta: &pb.Delta{Epoch: 1, Sequence: seq, Events: []*pb.BlockEvent{
		{Event: &pb.BlockEvent_Stored{Stored: &pb.BlockStored{BlockHashes: hashes, BlockSize: 4}}},
	}}}}
}

// TestMetricsOfAnIndex guards the index's metrics through an Index wired as
// cmd/cache-index wires it (the Observer and the instrumented Store): every
// name, label and help text the docs and alerts use, and what each counts.
func TestMetricsOfAnIndex(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	m := indexmetrics.New(reg)
	now := time.Unix(1_700_000_000, 0)
	ix := kvindex.New(kvindex.Options{
		Store: m.Store(memstore.New()), Observer: m, Lease: time.Minute,
		Policy: kvindex.Policy{}, Now: func() time.Time { return now },
	})
	sess := ix.NewSession(kvindex.Caller{Username: "system:serviceaccount:team:vllm", Namespace: "team", PodName: "vllm-0", PodUID: "uid-0"}, func() {})
	steps := []*pb.IngestRequest{
		{Message: &pb.IngestRequest_Hello{Hello: &pb.Hello{
			ProtocolVersion: kvindex.ProtocolVersion, Pod: &pb.PodIdentity{Namespace: "team", Name: "vllm-0", Uid: "uid-0"},
			CacheBackend: &pb.CacheBackendRef{Namespace: "team", Name: "cache"}, Model: "m",
			HashScheme: &pb.HashScheme{Algorithm: "sha256_cbor", Seed: "s", BlockSize: 4},
		}}},
		delta(1, 10, 11, 12), // applied: 3 block events
		delta(1, 10, 11, 12), // duplicate
		delta(3, 13),         // need_snapshot: a gap
		{Message: &pb.IngestRequest_SnapshotBegin{SnapshotBegin: &pb.SnapshotBegin{Epoch: 1, Sequence: 3, BlockCount: 1}}},
		{Message: &pb.IngestRequest_SnapshotChunk{SnapshotChunk: &pb.SnapshotChunk{Epoch: 1, Entries: []*pb.SnapshotEntries{{BlockHashes: []uint64{10}}}}}},
		{Message: &pb.IngestRequest_SnapshotEnd{SnapshotEnd: &pb.SnapshotEnd{Epoch: 1, Sequence: 3, BlockCount: 1}}},
	}
	for i, req := range steps {
		if _, err := sess.Handle(ctx, req); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	if _, err := ix.Score(ctx, kvindex.Caller{Namespace: "other"}, &pb.ScoreRequest{CacheBackend: &pb.CacheBackendRef{Namespace: "team", Name: "cache"}, Model: "m"}); err == nil {
		t.Fatal("a caller of another namespace scored")
	}
	if _, err := ix.Score(ctx, kvindex.Caller{Namespace: "team"}, &pb.ScoreRequest{CacheBackend: &pb.CacheBackendRef{Namespace: "team", Name: "cache"}, Model: "m", BlockHashes: []uint64{10}}); err != nil {
		t.Fatal(err)
	}
	open := "# HELP inferencecache_index_streams Subscriber streams connected to this replica.\n# TYPE inferencecache_index_streams gauge\ninferencecache_index_streams 1\n"
	if err := testutil.GatherAndCompare(reg, strings.NewReader(open), "inferencecache_index_streams"); err != nil {
		t.Fatalf("with a stream open: %v", err)
	}
	sess.Close()
	now = now.Add(2 * time.Minute)
	if n, err := ix.ExpireLeases(ctx); err != nil || n != 1 {
		t.Fatalf("ExpireLeases = %d, %v", n, err)
	}

	want := `
# HELP inferencecache_index_block_events_total Block stores, removals and clears applied.
# TYPE inferencecache_index_block_events_total counter
inferencecache_index_block_events_total 3
# HELP inferencecache_index_deltas_total Deltas received, by outcome (applied, duplicate, need_snapshot).
# TYPE inferencecache_index_deltas_total counter
inferencecache_index_deltas_total{outcome="applied"} 1
inferencecache_index_deltas_total{outcome="duplicate"} 1
inferencecache_index_deltas_total{outcome="need_snapshot"} 1
# HELP inferencecache_index_evictions_total Pods whose blocks were removed, by reason.
# TYPE inferencecache_index_evictions_total counter
inferencecache_index_evictions_total{reason="lease"} 1
# HELP inferencecache_index_refused_total Calls refused by authentication or authorisation, by API (ingest, query).
# TYPE inferencecache_index_refused_total counter
inferencecache_index_refused_total{api="query"} 1
# HELP inferencecache_index_resyncs_total Snapshots requested from subscribers, by reason.
# TYPE inferencecache_index_resyncs_total counter
inferencecache_index_resyncs_total{reason="gap"} 1
# HELP inferencecache_index_snapshots_applied_total Snapshots applied.
# TYPE inferencecache_index_snapshots_applied_total counter
inferencecache_index_snapshots_applied_total 1
# HELP inferencecache_index_streams Subscriber streams connected to this replica.
# TYPE inferencecache_index_streams gauge
inferencecache_index_streams 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"inferencecache_index_block_events_total", "inferencecache_index_deltas_total", "inferencecache_index_evictions_total",
		"inferencecache_index_refused_total", "inferencecache_index_resyncs_total", "inferencecache_index_snapshots_applied_total",
		"inferencecache_index_streams"); err != nil {
		t.Fatal(err)
	}

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	helps := map[string]string{}
	for _, f := range families {
		if h := f.GetMetric()[0].GetHistogram(); h != nil {
			counts[f.GetName()], helps[f.GetName()] = h.GetSampleCount(), f.GetHelp()
		}
	}
	// Three deltas reached the store without error (applied, duplicate,
	// the gap); one Score was answered (the refused one is not timed).
	if counts["inferencecache_index_apply_duration_seconds"] != 3 || helps["inferencecache_index_apply_duration_seconds"] != "Time to apply one delta in the store." {
		t.Errorf("apply duration: %d observations, help %q", counts["inferencecache_index_apply_duration_seconds"], helps["inferencecache_index_apply_duration_seconds"])
	}
	if counts["inferencecache_index_score_duration_seconds"] != 1 || helps["inferencecache_index_score_duration_seconds"] != "Time to answer one Score query." {
		t.Errorf("score duration: %d observations, help %q", counts["inferencecache_index_score_duration_seconds"], helps["inferencecache_index_score_duration_seconds"])
	}
}

func TestLimitRefusalsByScope(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := indexmetrics.New(reg)
	m.OverLimit(kvindex.ScopePod)
	m.OverLimit(kvindex.ScopePod)
	m.OverLimit(kvindex.ScopeNamespace)
	want := `
# HELP inferencecache_index_limit_refusals_total Deltas and snapshots refused because they would pass a block limit, by scope (pod, backend, namespace, spaces, staging, namespace-staging).
# TYPE inferencecache_index_limit_refusals_total counter
inferencecache_index_limit_refusals_total{scope="namespace"} 1
inferencecache_index_limit_refusals_total{scope="pod"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "inferencecache_index_limit_refusals_total"); err != nil {
		t.Fatal(err)
	}
}
