package security

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	pb "github.com/inferencecache/operator/internal/kvindexpb"
	"github.com/inferencecache/operator/test/testutil/freeport"
)

// indexMemoryLimit is the cache-index container's memory limit in the
// bundle, in bytes.
func indexMemoryLimit(t *testing.T) int64 {
	raw, err := os.ReadFile("../../kustomize/base/index/deployment.yaml")
	require.NoError(t, err)
	var d appsv1.Deployment
	require.NoError(t, yaml.Unmarshal(raw, &d))
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name == "cache-index" {
			q := c.Resources.Limits.Memory()
			require.False(t, q.IsZero(), "the cache-index container has a memory limit")
			return q.Value()
		}
	}
	t.Fatal("no cache-index container in kustomize/base/index/deployment.yaml")
	return 0
}

// TestIndexBinaryUnderTheSnapshotAttack: the real cache-index binary, with
// the bundle's GOMEMLIMIT, under issue 25's attack. First one stream
// announcing its ranks, a SnapshotBegin of 4,000,000 blocks for each, then
// 91 MiB of snapshot entries (what grew the process by 990 MiB, past the
// bundle's 1 GiB limit, before the bounds). Then sixteen streams, one pod
// each, each staging a whole 4,000,000-entry snapshot without its end (512
// MiB sent; 1 GiB staged without the index's staging budget). Its peak
// RSS stays under three quarters of the container's limit, and afterwards
// it still applies a pod's snapshot.
func TestIndexBinaryUnderTheSnapshotAttack(t *testing.T) {
	limit := indexMemoryLimit(t)
	work := t.TempDir()
	bin := filepath.Join(work, "cache-index")
	out, err := exec.Command("go", "build", "-o", bin, "../../cmd/cache-index").CombinedOutput()
	require.NoError(t, err, "%s", out)

	grpcPort, httpPort, probePort := freeport.MustTake(t), freeport.MustTake(t), freeport.MustTake(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ix := exec.CommandContext(ctx, bin, "--auth=none", "--store=memory",
		fmt.Sprintf("--grpc-bind-address=127.0.0.1:%d", grpcPort), fmt.Sprintf("--http-bind-address=127.0.0.1:%d", httpPort),
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probePort))
	ix.Env = append(os.Environ(), fmt.Sprintf("GOMEMLIMIT=%d", limit)) // as the Deployment sets it
	ix.Stdout, ix.Stderr = io.Discard, os.Stderr
	require.NoError(t, ix.Start())
	t.Cleanup(func() { cancel(); _ = ix.Wait() })
	healthz := fmt.Sprintf("http://127.0.0.1:%d/healthz", probePort)
	serves := func() bool {
		r, err := http.Get(healthz) //nolint:noctx // a local probe
		if err != nil {
			return false
		}
		_ = r.Body.Close()
		return r.StatusCode == http.StatusOK
	}
	require.Eventually(t, serves, 30*time.Second, 100*time.Millisecond, "cache-index serves /healthz")
	before := peakRSS(t, ix.Process.Pid)

	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", grpcPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	client := pb.NewIngestClient(conn)

	// One stream: a begin on every rank, every chunk for rank 0, whose
	// begin fits the stream's staging bound: the most one stream could
	// make the index stage.
	const ranks = 64 // --max-ranks' default: a Hello with more is refused
	attacker := openStream(ctx, t, client, "attacker", ranks)
	for r := range uint32(ranks) {
		require.NoError(t, attacker.Send(begin(r, 4_000_000)))
	}
	const chunk = 100_000 // 800 KB of hashes a message, under the 16 MiB receive limit
	var sent int64
	for i := 0; sent < 91<<20; i++ {
		if attacker.Send(chunkOf(0, uint64(i)*chunk, chunk)) != nil {
			break // the index ended the stream: what it holds is bounded too
		}
		sent += 8 * chunk
	}
	_ = attacker.CloseSend()
	require.Eventually(t, serves, 30*time.Second, 100*time.Millisecond, "cache-index still serves after one stream's attack")
	time.Sleep(2 * time.Second) // let the last chunks be staged before reading the peak
	onePeak := peakRSS(t, ix.Process.Pid)
	assert.GreaterOrEqual(t, sent, int64(91<<20), "the whole first attack was sent")

	// Sixteen streams, one pod each, each a whole snapshot without its end.
	const pods, perPod = 16, 4_000_000
	streams := make([]pb.Ingest_StreamClient, pods)
	for p := range streams {
		streams[p] = openStream(ctx, t, client, fmt.Sprintf("attacker-%d", p), 1)
		require.NoError(t, streams[p].Send(begin(0, perPod)))
	}
	var manySent int64
	for c := range perPod / chunk {
		for _, st := range streams {
			if st.Send(chunkOf(0, uint64(c)*chunk, chunk)) == nil {
				manySent += 8 * chunk
			}
		}
	}
	require.Eventually(t, serves, 30*time.Second, 100*time.Millisecond, "cache-index still serves after sixteen streams' attack")
	time.Sleep(2 * time.Second)
	peak := peakRSS(t, ix.Process.Pid)
	for _, st := range streams {
		_ = st.CloseSend()
	}
	t.Logf("cache-index peak RSS %d MiB before, %d MiB after one stream sent %d MiB of snapshot entries, %d MiB after %d streams sent %d MiB; container limit %d MiB",
		before>>20, onePeak>>20, sent>>20, peak>>20, pods, manySent>>20, limit>>20)
	assert.Equal(t, int64(pods*perPod*8), manySent, "every stream's snapshot was sent")
	assert.Less(t, peak, limit*3/4, "the index's peak RSS stays well under its container limit")

	// The attackers' streams closed, their staging is given back: a pod's
	// snapshot applies.
	require.Eventually(t, func() bool {
		legit := openStream(ctx, t, client, "legit", 1)
		defer func() { _ = legit.CloseSend() }()
		if legit.Send(begin(0, 1000)) != nil || legit.Send(chunkOf(0, 0, 1000)) != nil ||
			legit.Send(&pb.IngestRequest{Message: &pb.IngestRequest_SnapshotEnd{SnapshotEnd: &pb.SnapshotEnd{Rank: 0, Epoch: 1, Sequence: 1, BlockCount: 1000}}}) != nil {
			return false
		}
		for {
			r, err := legit.Recv()
			if err != nil {
				return false
			}
			if r.GetAck() != nil {
				return r.GetAck().GetApplied().GetSequence() == 1
			}
		}
	}, 30*time.Second, time.Second, "a pod's snapshot applies after the attack")
	require.NoError(t, ix.Process.Signal(os.Interrupt))
}

// openStream opens an ingest stream for pod (its own uid) in namespace
// attacker, says Hello with ranks ranks and drains its answers.
func openStream(ctx context.Context, t *testing.T, client pb.IngestClient, pod string, ranks uint32) pb.Ingest_StreamClient {
	t.Helper()
	stream, err := client.Stream(ctx)
	require.NoError(t, err)
	require.NoError(t, stream.Send(&pb.IngestRequest{Message: &pb.IngestRequest_Hello{Hello: &pb.Hello{
		ProtocolVersion: 1, Model: "m", DataParallelSize: ranks,
		Pod:          &pb.PodIdentity{Namespace: "attacker", Name: pod, Uid: "uid-" + pod},
		CacheBackend: &pb.CacheBackendRef{Namespace: "attacker", Name: "any"},
		HashScheme:   &pb.HashScheme{Algorithm: "sha256_cbor", BlockSize: 16},
	}}}))
	if pod != "legit" {
		go func() {
			for {
				if _, err := stream.Recv(); err != nil {
					return
				}
			}
		}()
	}
	return stream
}

func begin(rank uint32, blocks uint64) *pb.IngestRequest {
	return &pb.IngestRequest{Message: &pb.IngestRequest_SnapshotBegin{SnapshotBegin: &pb.SnapshotBegin{Rank: rank, Epoch: 1, Sequence: 1, BlockCount: blocks}}}
}

// chunkOf is a snapshot chunk of n CPU-tier hashes from first+1.
func chunkOf(rank uint32, first uint64, n int) *pb.IngestRequest {
	hashes := make([]uint64, n)
	for j := range hashes {
		hashes[j] = first + uint64(j) + 1
	}
	return &pb.IngestRequest{Message: &pb.IngestRequest_SnapshotChunk{SnapshotChunk: &pb.SnapshotChunk{
		Rank: rank, Epoch: 1, Entries: []*pb.SnapshotEntries{{Tier: pb.Tier_TIER_CPU, BlockHashes: hashes}},
	}}}
}
