// Package integration runs the index's authentication against a real
// kube-apiserver (envtest with the project's control-plane binaries):
// ServiceAccount tokens come from the TokenRequest API and are checked with
// TokenReview, as in a cluster.
package integration

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/memstore"
	"github.com/inferencecache/operator/internal/kvindex/server"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
	"github.com/inferencecache/operator/test/controlplane"
)

const audience = "inferencecache-index"

func TestServiceAccountTokensAgainstTheAPIServer(t *testing.T) {
	dir, err := controlplane.Dir()
	if err != nil {
		t.Fatalf("the integration test needs the local control plane: %v", err)
	}
	env := &envtest.Environment{BinaryAssetsDirectory: dir}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting kube-apiserver and etcd: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	for _, ns := range []string{"team-a", "team-b"} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, sa := range []string{"vllm", "router"} {
			if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The engine pod whose sidecar publishes; its token is bound to it, as
	// a projected ServiceAccount token is.
	pod, err := cs.CoreV1().Pods("team-a").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "vllm-0"},
		Spec: corev1.PodSpec{ServiceAccountName: "vllm", AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	token := func(ns, sa string, aud string, bound *corev1.Pod) string {
		t.Helper()
		req := &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{Audiences: []string{aud}, ExpirationSeconds: ptr.To[int64](600)}}
		if bound != nil {
			req.Spec.BoundObjectRef = &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: bound.Name, UID: bound.UID}
		}
		res, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, req, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("TokenRequest for %s/%s: %v", ns, sa, err)
		}
		return res.Status.Token
	}
	subA := token("team-a", "vllm", audience, pod)
	subB := token("team-b", "vllm", audience, nil)
	subUnbound := token("team-a", "vllm", audience, nil) // kubectl create token vllm --audience …
	subWrongAudience := token("team-a", "vllm", "some-other-service", pod)
	routerA := token("team-a", "router", audience, nil)
	routerB := token("team-b", "router", audience, nil)

	reviews := &countingReviewer{TokenReviewer: cs.AuthenticationV1().TokenReviews()}
	ix := kvindex.New(kvindex.Options{
		Store:         memstore.New(),
		Authenticator: &server.TokenReviewAuthenticator{Reviewer: reviews, Audiences: []string{audience}, CacheTTL: time.Minute},
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	server.RegisterGRPC(srv, ix)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })

	hello := &pb.IngestRequest{Message: &pb.IngestRequest_Hello{Hello: &pb.Hello{
		ProtocolVersion: 1, Model: "m", DataParallelSize: 1,
		Pod:          &pb.PodIdentity{Namespace: "team-a", Name: pod.Name, Uid: string(pod.UID)},
		CacheBackend: &pb.CacheBackendRef{Namespace: "team-a", Name: "cache"},
		HashScheme:   &pb.HashScheme{Algorithm: "sha256_cbor", Seed: "vllm-none-hash", BlockSize: 16},
	}}}
	publish := func(tok string) (*pb.IngestResponse, pb.Ingest_StreamClient, error) {
		t.Helper()
		sctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok))
		t.Cleanup(cancel)
		st, err := pb.NewIngestClient(conn).Stream(sctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(hello); err != nil {
			t.Fatal(err)
		}
		m, err := st.Recv()
		return m, st, err
	}

	t.Run("refused subscriber with a token from another namespace", func(t *testing.T) {
		_, _, err := publish(subB)
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("team-b token publishing for a team-a pod: %v, want PermissionDenied", err)
		}
	})
	t.Run("refused subscriber with a token of the namespace bound to no pod", func(t *testing.T) {
		_, _, err := publish(subUnbound)
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("an unbound team-a token publishing for a team-a pod: %v, want PermissionDenied", err)
		}
	})
	t.Run("refused subscriber with a token for another audience", func(t *testing.T) {
		_, _, err := publish(subWrongAudience)
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("token for another audience: %v, want Unauthenticated", err)
		}
	})
	t.Run("the pod's own bound token publishes", func(t *testing.T) {
		m, st, err := publish(subA)
		if err != nil || m.GetWelcome() == nil {
			t.Fatalf("team-a pod's token: %v, %v", m, err)
		}
		if err := st.Send(&pb.IngestRequest{Message: &pb.IngestRequest_Delta{Delta: &pb.Delta{Epoch: 1, Sequence: 1, Events: []*pb.BlockEvent{
			{Event: &pb.BlockEvent_Stored{Stored: &pb.BlockStored{BlockHashes: []uint64{11, 12}, Tier: pb.Tier_TIER_GPU}}},
		}}}}); err != nil {
			t.Fatal(err)
		}
		if a, err := st.Recv(); err != nil || a.GetAck().GetApplied().GetSequence() != 1 {
			t.Fatalf("ack: %v, %v", a, err)
		}
	})
	query := func(tok string) (*pb.ScoreResponse, error) {
		return pb.NewQueryClient(conn).Score(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok), &pb.ScoreRequest{
			CacheBackend: &pb.CacheBackendRef{Namespace: "team-a", Name: "cache"}, Model: "m", BlockHashes: []uint64{11, 12},
		})
	}
	t.Run("refused query for another CacheBackend's data", func(t *testing.T) {
		if _, err := query(routerB); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("team-b router reading team-a's backend: %v, want PermissionDenied", err)
		}
	})
	t.Run("query of the caller's own CacheBackend", func(t *testing.T) {
		resp, err := query(routerA)
		if err != nil || len(resp.GetPods()) != 1 || resp.GetPods()[0].GetMatchedTokens() != 32 {
			t.Fatalf("team-a router: %v, %v; want vllm-0 with 32 tokens", resp, err)
		}
		// Cached verdict: a second query costs no TokenReview.
		n := reviews.calls
		if _, err := query(routerA); err != nil || reviews.calls != n {
			t.Fatalf("second query: %v, %d reviews (was %d)", err, reviews.calls, n)
		}
	})
}

type countingReviewer struct {
	server.TokenReviewer
	calls int
}

func (c *countingReviewer) Create(ctx context.Context, tr *authnv1.TokenReview, opts metav1.CreateOptions) (*authnv1.TokenReview, error) {
	c.calls++
	return c.TokenReviewer.Create(ctx, tr, opts)
}
