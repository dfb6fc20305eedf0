package server

import (
	"context"
	"errors"
	"io"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/inferencecache/operator/internal/kvindex"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// RegisterGRPC serves the Ingest and Query services of ix on s.
func RegisterGRPC(s grpc.ServiceRegistrar, ix *kvindex.Index) {
	g := &grpcServer{ix: ix}
	pb.RegisterIngestServer(s, g)
	pb.RegisterQueryServer(s, g)
}

type grpcServer struct {
	pb.UnimplementedIngestServer
	pb.UnimplementedQueryServer
	ix *kvindex.Index
}

func bearer(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		if tok, ok := strings.CutPrefix(v, "Bearer "); ok {
			return strings.TrimSpace(tok)
		}
	}
	return ""
}

// grpcError maps the index's errors to gRPC status codes.
func grpcError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kvindex.ErrUnauthenticated):
		return status.Error(codes.Unauthenticated, err.Error())
	case errors.Is(err, kvindex.ErrForbidden):
		return status.Error(codes.PermissionDenied, err.Error())
	case errors.Is(err, kvindex.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, kvindex.ErrOverLimit):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, kvindex.ErrTokensUnsupported):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Unavailable, err.Error())
}

func (g *grpcServer) authenticate(ctx context.Context, api string) (kvindex.Caller, error) {
	return g.ix.Authenticate(ctx, api, bearer(ctx))
}

// Stream implements pb.IngestServer.
func (g *grpcServer) Stream(stream pb.Ingest_StreamServer) error {
	caller, err := g.authenticate(stream.Context(), "ingest")
	if err != nil {
		return grpcError(err)
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	sess := g.ix.NewSession(caller, cancel)
	defer sess.Close()

	msgs := make(chan *pb.IngestRequest)
	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			if stream.Context().Err() == nil {
				return status.Error(codes.Aborted, "replaced by a newer stream for this pod")
			}
			return grpcError(ctx.Err())
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case m := <-msgs:
			out, err := sess.Handle(ctx, m)
			for _, r := range out {
				if serr := stream.Send(r); serr != nil {
					return serr
				}
			}
			if err != nil {
				if !errors.Is(err, kvindex.ErrForbidden) && !errors.Is(err, kvindex.ErrInvalid) && !errors.Is(err, kvindex.ErrOverLimit) {
					g.ix.Log().Error(err, "ingest stream failed", "caller", caller.Username)
				} else {
					g.ix.Log().Info("ingest stream refused", "caller", caller.Username, "reason", err.Error())
				}
				return grpcError(err)
			}
		}
	}
}

// Score implements pb.QueryServer.
func (g *grpcServer) Score(ctx context.Context, req *pb.ScoreRequest) (*pb.ScoreResponse, error) {
	caller, err := g.authenticate(ctx, "query")
	if err != nil {
		return nil, grpcError(err)
	}
	resp, err := g.ix.Score(ctx, caller, req)
	return resp, grpcError(err)
}

// Participation implements pb.QueryServer.
func (g *grpcServer) Participation(ctx context.Context, req *pb.ParticipationRequest) (*pb.ParticipationSummary, error) {
	caller, err := g.authenticate(ctx, "query")
	if err != nil {
		return nil, grpcError(err)
	}
	resp, err := g.ix.Participation(ctx, caller, req)
	return resp, grpcError(err)
}
