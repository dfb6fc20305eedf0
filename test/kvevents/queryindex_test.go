package kvevents_test

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// queryIndex reads a real index through its Query API: Score with one
// block hash tells whether the test pod holds that block, and the
// participation summary counts the pod's blocks and snapshots (resyncs).
type queryIndex struct {
	conn    *grpc.ClientConn
	q       pb.QueryClient
	backend *pb.CacheBackendRef
	model   string
	pod     string
	stopFn  func()
}

func newQueryIndex(addr, namespace, backend, model, pod string, stop func()) (*queryIndex, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("index client: %w", err)
	}
	return &queryIndex{conn: conn, q: pb.NewQueryClient(conn), backend: &pb.CacheBackendRef{Namespace: namespace, Name: backend},
		model: model, pod: pod, stopFn: stop}, nil
}

func (ix *queryIndex) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 5*time.Second)
}

func (ix *queryIndex) holds(h uint64) (bool, error) {
	ctx, cancel := ix.ctx()
	defer cancel()
	r, err := ix.q.Score(ctx, &pb.ScoreRequest{CacheBackend: ix.backend, Model: ix.model, BlockHashes: []uint64{h}})
	if err != nil {
		return false, fmt.Errorf("score: %w", err)
	}
	for _, p := range r.GetPods() {
		if p.GetPodName() == ix.pod && p.GetRank() == 0 && p.GetTiers().GetGpu() >= 1 {
			return true, nil
		}
	}
	return false, nil
}

func (ix *queryIndex) pod0() (*pb.PodParticipation, error) {
	ctx, cancel := ix.ctx()
	defer cancel()
	s, err := ix.q.Participation(ctx, &pb.ParticipationRequest{CacheBackend: ix.backend})
	if err != nil {
		return nil, fmt.Errorf("participation: %w", err)
	}
	for _, p := range s.GetPodList() {
		if p.GetName() == ix.pod {
			return p, nil
		}
	}
	return &pb.PodParticipation{}, nil
}

func (ix *queryIndex) count() (int, error) {
	p, err := ix.pod0()
	return int(p.GetBlocks()), err
}

func (ix *queryIndex) snapshots() (int, error) {
	p, err := ix.pod0()
	return int(p.GetResyncs()), err
}

func (ix *queryIndex) state() (pb.PodState, error) {
	p, err := ix.pod0()
	return p.GetState(), err
}

func (ix *queryIndex) stop() {
	_ = ix.conn.Close()
	ix.stopFn()
}
