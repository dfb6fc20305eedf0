// Command kvevent-subscriber is the sidecar that follows a vLLM or SGLang
// engine's KV-cache events (ZeroMQ PUB, replay ROUTER) inside the engine's
// pod, keeps a mirror of the engine's cached blocks and streams compact
// deltas (block hashes, no token IDs once hashes verify) to the KV-block
// index over gRPC. It never slows the engine: the receive loop never waits
// on the index.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/zapr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/inferencecache/operator/internal/kvevent/forward"
	"github.com/inferencecache/operator/internal/kvevent/hashcheck"
	"github.com/inferencecache/operator/internal/kvevent/subscriber"
	"github.com/inferencecache/operator/internal/kvevent/zmtpguard"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
	"github.com/inferencecache/operator/internal/logging"
	"github.com/inferencecache/operator/internal/version"
)

func main() {
	if err := run(context.Background(), os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "kvevent-subscriber:", err)
		os.Exit(1)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// defaultQueueBytes bounds the payloads buffered for processing: a quarter
// of the memory limit the webhook gives the sidecar (128 MiB), far above
// what 10,000 block events a second keep queued.
const defaultQueueBytes = 32 << 20

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("kvevent-subscriber", flag.ContinueOnError)
	showVersion := fs.Bool("version", false, "print the version and exit")
	endpoint := fs.String("endpoint", envOr("KV_EVENTS_ENDPOINT", "tcp://127.0.0.1:5557"), "the engine's KV-event PUB endpoint (tcp:// or ipc://); rank r of --data-parallel-size uses port + r")
	replay := fs.String("replay-endpoint", os.Getenv("KV_EVENTS_REPLAY_ENDPOINT"), "the engine's replay ROUTER endpoint; empty disables gap recovery")
	topic := fs.String("topic", os.Getenv("KV_EVENTS_TOPIC"), "the publisher's topic (frame 0); empty receives every topic")
	dpSize := fs.Int("data-parallel-size", envInt("KV_EVENTS_DP_SIZE", 1), "the engine's data-parallel ranks, one publisher each")
	index := fs.String("index", os.Getenv("INDEX_ENDPOINT"), "the KV-block index's gRPC address (host:port); a name resolving to several addresses (a headless Service) gets every delta on each; empty keeps the mirror without forwarding")
	resolveInterval := fs.Duration("resolve-interval", 20*time.Second, "how often --index is resolved to its replicas' addresses (also on a failed stream)")
	tokenFile := fs.String("token-file", os.Getenv("INDEX_TOKEN_FILE"), "file with the bearer token for the index (a projected ServiceAccount token), read on every connect")
	model := fs.String("model", os.Getenv("MODEL_ID"), "the served model name routers query the index with")
	backend := fs.String("cachebackend", os.Getenv("CACHEBACKEND"), "the CacheBackend the pod belongs to, as namespace/name")
	podName := fs.String("pod-name", os.Getenv("POD_NAME"), "this pod's name (downward API)")
	podNS := fs.String("pod-namespace", os.Getenv("POD_NAMESPACE"), "this pod's namespace (downward API)")
	podUID := fs.String("pod-uid", os.Getenv("POD_UID"), "this pod's UID (downward API)")
	nodeName := fs.String("node-name", os.Getenv("NODE_NAME"), "this pod's node (downward API)")
	workerAddress := fs.String("worker-address", workerURL(os.Getenv("WORKER_ADDRESS"), os.Getenv("POD_IP"), os.Getenv("WORKER_PORT")), "the engine as routers name it, e.g. http://10.0.3.7:30000; the default is http://$POD_IP:$WORKER_PORT, which the webhook sets for SGLang pods from the pod's IP and SGLang's --port; the index gives it to SGLang's router as worker_address")
	engine := fs.String("engine", envOr("KV_EVENTS_ENGINE", "vllm"), "the engine: vllm or sglang")
	hashAlgo := fs.String("hash-algorithm", envOr("KV_EVENTS_HASH_ALGORITHM", "sha256_cbor"), "the engine's block hash: sha256_cbor (vLLM --prefix-caching-hash-algo; the default for vllm), sglang_sha256 (the default for sglang), or another (unverifiable)")
	hashSeeds := fs.String("hash-seeds", envOr("KV_EVENTS_HASH_SEEDS", hashcheck.SeedVLLM), "comma-separated NONE_HASH seeds to try: vllm-none-hash and/or the engine's PYTHONHASHSEED")
	blockSize := fs.Int("block-size", envInt("KV_EVENTS_BLOCK_SIZE", 0), "tokens per block the engine hashes, as its command line sets it; 0 (the default) announces none until the engine's events carry it (every BlockStored does), and the hash scheme is announced again whenever the events' block size differs")
	sendTokens := fs.Bool("send-tokens", false, "forward token IDs while hashes are not Verified (they leave the pod)")
	httpAddr := fs.String("http-bind-address", ":8090", "address of /healthz, /readyz and /metrics")
	queue := fs.Int("queue-size", 4096, "live messages buffered for processing; more are dropped (counted) and replayed")
	queueBytes := fs.Int64("queue-bytes", defaultQueueBytes, "payload bytes buffered for processing; more are dropped (counted) and replayed; a ZeroMQ frame announced larger is refused before it is read")
	forwardQueue := fs.Int("forward-queue-size", 4096, "deltas buffered for the forwarders, and for each index replica; more are dropped (counted) and resent as a snapshot")
	journal := fs.Int("journal-limit", 50000, "unacknowledged deltas kept for reconnects; past it the rank is resent as a snapshot")
	replayIdle := fs.Duration("replay-idle-timeout", 2*time.Second, "a replay that stays silent this long is resumed")
	development := fs.Bool("zap-devel", false, "human-readable console logs at debug level instead of JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *showVersion {
		fmt.Println(version.String("kvevent-subscriber"))
		return nil
	}
	switch *engine {
	case "vllm":
	case "sglang":
		set := false
		fs.Visit(func(f *flag.Flag) { set = set || f.Name == "hash-algorithm" })
		if !set && os.Getenv("KV_EVENTS_HASH_ALGORITHM") == "" {
			*hashAlgo = "sglang_sha256"
		}
	default:
		return fmt.Errorf("--engine %q: want vllm or sglang", *engine)
	}
	if *queueBytes > 0 {
		// A frame larger than the queue could never be queued: refuse it
		// before the ZeroMQ library allocates it.
		zmtpguard.SetMaxFrame(uint64(*queueBytes))
	}
	if *dpSize < 1 || *dpSize > 1024 {
		return fmt.Errorf("--data-parallel-size %d: want 1 to 1024", *dpSize)
	}
	zl, err := logging.New(*development)
	if err != nil {
		return fmt.Errorf("logger: %w", err)
	}
	log := zapr.NewLogger(zl).WithValues("pod", *podNS+"/"+*podName)

	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := subscriber.NewMetrics(reg)

	deltas := make(chan *pb.Delta, *forwardQueue)
	sources := map[uint32]forward.Source{}
	var ranks []*subscriber.Rank
	for r := 0; r < *dpSize; r++ {
		ep, err := offsetEndpoint(*endpoint, r)
		if err != nil {
			return err
		}
		rep := *replay
		if rep != "" {
			if rep, err = offsetEndpoint(rep, r); err != nil {
				return err
			}
		}
		rk := subscriber.NewRank(subscriber.Config{Rank: r, Endpoint: ep, ReplayEndpoint: rep, Topic: *topic, QueueSize: *queue, QueueBytes: *queueBytes,
			ReplayIdle: *replayIdle, SendTokens: *sendTokens,
			Scheme: hashcheck.Scheme{Algorithm: *hashAlgo, Seeds: strings.Split(*hashSeeds, ",")}}, log, m, deltas)
		ranks = append(ranks, rk)
		sources[uint32(r)] = rk
	}

	var ready atomic.Bool
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		// Ready once the processing loops run: the subscriber's own health,
		// never the engine's (an idle engine sends nothing).
		if !ready.Load() {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	ln, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *httpAddr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Close() }()

	for _, rk := range ranks {
		go func(rk *subscriber.Rank) { _ = rk.Run(ctx) }(rk)
	}
	log.Info("following the engine's KV events", "endpoint", *endpoint, "replayEndpoint", *replay, "ranks", *dpSize,
		"index", *index, "http", ln.Addr().String(), "version", version.Version)
	ready.Store(true)

	if *index == "" {
		// Mirror only: drain the deltas.
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-deltas:
			}
		}
	}
	ns, name, _ := strings.Cut(*backend, "/")
	hello := &pb.Hello{ProtocolVersion: 1,
		Pod:               &pb.PodIdentity{Namespace: *podNS, Name: *podName, Uid: *podUID, NodeName: *nodeName},
		CacheBackend:      &pb.CacheBackendRef{Namespace: ns, Name: name},
		Model:             *model,
		Engine:            *engine,
		HashScheme:        &pb.HashScheme{Algorithm: *hashAlgo, Seed: strings.Split(*hashSeeds, ",")[0], BlockSize: uint32(*blockSize)},
		DataParallelSize:  uint32(*dpSize),
		SubscriberVersion: version.Version,
		WorkerAddress:     *workerAddress,
	}
	fw := forward.NewFanout(forward.FanoutConfig{
		Forwarder: forward.Config{Target: *index, Hello: hello, TokenFile: *tokenFile, JournalLimit: *journal},
		Interval:  *resolveInterval,
		QueueSize: *forwardQueue,
	}, log.WithName("forward"),
		forward.FanoutMetrics{
			Metrics: forward.Metrics{
				JournalDepth: func(n int) { m.JournalDepth.Set(float64(n)) },
				Snapshot:     func(reason string) { m.Snapshots.WithLabelValues(reason).Inc() },
			},
			Targets:           func(n int) { m.Targets.Set(float64(n)) },
			ConnectedReplicas: func(n int) { m.Connected.Set(float64(n)) },
			Dropped:           func(string) { m.Dropped.WithLabelValues("replica").Inc() },
		}, deltas, sources)
	return fw.Run(ctx)
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// offsetEndpoint is vLLM's offset_endpoint_port: rank 0 unchanged, tcp
// ports + rank, inproc "_dp<r>", anything else (ipc://) an error.
func offsetEndpoint(ep string, rank int) (string, error) {
	if rank == 0 {
		return ep, nil
	}
	if strings.HasPrefix(ep, "tcp://") {
		u, err := url.Parse(ep)
		if err != nil {
			return "", fmt.Errorf("endpoint %q: %w", ep, err)
		}
		port, err := strconv.Atoi(u.Port())
		if err != nil {
			return "", fmt.Errorf("endpoint %q has no port: %w", ep, err)
		}
		return "tcp://" + net.JoinHostPort(u.Hostname(), strconv.Itoa(port+rank)), nil
	}
	return "", fmt.Errorf("endpoint %q: data-parallel ranks need tcp:// endpoints (vLLM cannot offset %s)", ep, strings.SplitN(ep, ":", 2)[0])
}

// workerURL is the engine's URL as routers name it: address when set,
// else http://ip:port (brackets around an IPv6 address), else "".
func workerURL(address, ip, port string) string {
	if address != "" || ip == "" || port == "" {
		return address
	}
	return "http://" + net.JoinHostPort(ip, port)
}
