package server

import (
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Limits of the index's servers. A caller that sends its request slowly,
// or keeps a connection idle, holds it for at most these; one connection
// carries at most MaxConcurrentStreams gRPC streams.
const (
	HTTPReadTimeout      = 30 * time.Second
	HTTPWriteTimeout     = 30 * time.Second
	HTTPIdleTimeout      = 2 * time.Minute
	HTTPMaxHeaderBytes   = 64 << 10
	MaxConcurrentStreams = 256
	MaxRecvMsgSize       = 16 << 20
)

// NewHTTPServer is the http.Server of the index's HTTP API and probes, on
// addr: with read, write and idle timeouts (not only a header timeout) and
// a bound on header bytes.
func NewHTTPServer(addr string, h http.Handler) *http.Server {
	return &http.Server{
		Addr: addr, Handler: h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       HTTPReadTimeout,
		WriteTimeout:      HTTPWriteTimeout,
		IdleTimeout:       HTTPIdleTimeout,
		MaxHeaderBytes:    HTTPMaxHeaderBytes,
	}
}

// GRPCOptions are the gRPC server's options: keepalives, the largest
// message (a snapshot chunk is under 1 MiB) and at most
// MaxConcurrentStreams streams per connection.
func GRPCOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.MaxRecvMsgSize(MaxRecvMsgSize),
		grpc.MaxConcurrentStreams(MaxConcurrentStreams),
	}
}
