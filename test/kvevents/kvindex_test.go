package kvevents_test

import (
	"net"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/inferencecache/operator/internal/kvindex"
)

// startLibraryIndex serves the index service's own package
// (internal/kvindex: memory store, no authentication) in the test process,
// read back through its Query API.
func startLibraryIndex(t *testing.T, addr string) index {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ix := kvindex.New(kvindex.Options{Store: kvindex.NewMemStore(), Authenticator: kvindex.AllowAll{}, Log: logr.Discard(),
		Metrics: kvindex.NewMetrics(prometheus.NewRegistry())})
	s := grpc.NewServer()
	kvindex.RegisterGRPC(s, ix)
	go func() { _ = s.Serve(ln) }()
	q, err := newQueryIndex(ln.Addr().String(), "ns", "cb", "m", "engine-0", s.Stop)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// TestInteroperabilityIndexLibrary runs the scenario against the index
// service's own ingest and query code.
func TestInteroperabilityIndexLibrary(t *testing.T) {
	interop(t, startLibraryIndex, "buffer_steps=8", "block_size=4", "topic=kv", "events=map", "gen=spec", "replay=new")
}
