// Command cache-index is the KV-block index service: kvevent-subscribers
// stream their engine pods' cached blocks to it over gRPC (Ingest), routers
// ask it which pods hold a prompt's prefix (Query.Score over gRPC, or the
// Mooncake-shaped HTTP /query), and the operator reads each CacheBackend's
// participation summary. State is in memory, or in Redis/Valkey for several
// replicas. Callers authenticate with Kubernetes ServiceAccount tokens,
// checked with TokenReview. docs/design/grpc-contract.md describes the API.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"google.golang.org/grpc"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/indexmetrics"
	"github.com/inferencecache/operator/internal/kvindex/memstore"
	"github.com/inferencecache/operator/internal/kvindex/redisstore"
	"github.com/inferencecache/operator/internal/kvindex/server"
	"github.com/inferencecache/operator/internal/logging"
	"github.com/inferencecache/operator/internal/version"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "cache-index:", err)
		os.Exit(1)
	}
}

// The default block limits. One block of one pod costs the memory store
// at most 64 heap bytes (memstore's TestPodBlockLimitBoundsTheHeap
// measures 46), so a namespace at its limit holds at most 512 MiB, half
// of the index's 1 GiB container limit (kustomize/base/index). A pod's
// 4,000,000 blocks fit the CPU and disk tiers of an 8-GPU node serving a
// 70B-class model (about 5 MiB of KV cache a 16-token block: 2 TiB of
// host memory and 16 TiB of disk); docs/kvindex.md says how to size
// them for more.
const (
	defaultMaxPodBlocks       = 4_000_000
	defaultMaxBackendBlocks   = 8_000_000
	defaultMaxNamespaceBlocks = 8_000_000
	// defaultMaxNamespaceSpaces bounds the block spaces (model, LoRA
	// adapter, hash scheme) of a namespace in the memory store: each costs
	// about 700 heap bytes besides its blocks, so 16,384 take about
	// 11 MiB, and leave room for thousands of adapters per backend.
	defaultMaxNamespaceSpaces = 16_384
)

type stringList []string

func (s *stringList) String() string { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error {
	*s = append(*s, v)
	return nil
}

func run(args []string) error {
	fs := flag.NewFlagSet("cache-index", flag.ContinueOnError)
	grpcAddr := fs.String("grpc-bind-address", ":9400", "address the gRPC Ingest and Query services bind to")
	httpAddr := fs.String("http-bind-address", ":9401", "address the HTTP/JSON query API (/query, /query_by_hash, /v1/score, /v1/backends/...) binds to")
	probeAddr := fs.String("health-probe-bind-address", ":8081", "address /healthz, /readyz and /metrics bind to")
	storeKind := fs.String("store", "memory", "where the index lives: memory (one replica) or redis (replicas share it)")
	redisAddr := fs.String("redis-address", "127.0.0.1:6379", "Redis or Valkey address (host:port), with --store=redis; for a Redis Cluster or Valkey cluster, one or more of its nodes, comma-separated (more than one means a cluster); with --redis-sentinel-master, the Sentinels'")
	redisCluster := fs.Bool("redis-cluster", false, "--redis-address is a Redis Cluster or Valkey cluster even when it names one node (a cluster's configuration endpoint)")
	redisSentinelMaster := fs.String("redis-sentinel-master", "", "the Sentinel master name: --redis-address then lists Sentinels, and the index follows the master they elect")
	redisDB := fs.Int("redis-db", 0, "Redis database number, with --store=redis")
	redisWaitReplicas := fs.Int("redis-wait-replicas", 0, "with --store=redis, ack a subscriber's change only once this many replicas of each master it wrote hold it (Redis' WAIT), so that a master's crash and its replica's promotion lose no acked placement; 0 acks once the master holds it (asynchronous replication: a crash can lose the last writes)")
	redisWaitTimeout := fs.Duration("redis-wait-timeout", redisstore.DefaultWaitTimeout, "how long each write waits for --redis-wait-replicas; a write that reaches fewer is not acked, and the subscriber sends it again")
	redisReadModel := fs.Bool("redis-read-model", true, "with --store=redis, answer queries from a copy of every backend's placements and pod records in this replica's memory (about what --store=memory holds), kept current from each backend's feed in Redis; false asks Redis for each block of a prompt (no copy, slower queries)")
	redisReadModelMaxLag := fs.Duration("redis-read-model-max-lag", 0, "with the read model, answer without a round trip to Redis while the copy was brought up to date less than this long ago (a query may then miss a change acked that long before it); 0 reads the feed for every query, so that a query sees every change acked before it")
	redisPlacements := fs.Bool("redis-placements", true, "with --store=redis, write each block's placement key, which only --redis-read-model=false reads; false saves Redis a write per block update, and needs the read model on every replica of the index")
	redisPasswordFile := fs.String("redis-password-file", "", "file holding the Redis password (e.g. a mounted Secret), with --store=redis")
	authMode := fs.String("auth", "tokenreview", "caller authentication: tokenreview (ServiceAccount tokens checked with the API server) or none (every caller allowed; local tests only)")
	audiences := stringList{}
	fs.Var(&audiences, "audience", "token audience the index accepts (repeatable; default "+v1alpha1.IndexTokenAudience+", the kvevent-subscriber token's)")
	readers := stringList{}
	sglangIndexers := stringList{}
	fs.Var(&sglangIndexers, "sglang-kv-indexer", "namespace/name=host:port: serve SGLang's router query (kv_indexer.v1.KVIndexer/MatchExternalKvPrefix, the router's --kv-indexer-endpoint) for that CacheBackend on that address, without authentication (the router's client sends none; keep it to the router with a NetworkPolicy); repeatable, one address a backend")
	fs.Var(&readers, "cluster-reader", "username allowed to query every CacheBackend, e.g. system:serviceaccount:inferencecache-system:inferencecache-operator (repeatable)")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig for the TokenReview API when running outside a cluster (in-cluster config otherwise)")
	lease := fs.Duration("lease", time.Minute, "a pod whose subscriber sends nothing for this long loses its blocks")
	heartbeat := fs.Duration("heartbeat", 10*time.Second, "heartbeat interval asked of idle subscribers; a pod is Stale after 3 missed")
	maxPodBlocks := fs.Uint64("max-blocks-per-pod", defaultMaxPodBlocks, "blocks one pod may hold in the index, all ranks and tiers (a block in two tiers counts once); a delta or snapshot past it is refused with ResourceExhausted; 0: no limit")
	maxBackendBlocks := fs.Uint64("max-blocks-per-backend", defaultMaxBackendBlocks, "blocks the pods of one CacheBackend may hold together; 0: no limit")
	maxNamespaceBlocks := fs.Uint64("max-blocks-per-namespace", defaultMaxNamespaceBlocks, "blocks the CacheBackends of one namespace may hold together; 0: no limit")
	maxNamespaceSpaces := fs.Uint64("max-spaces-per-namespace", defaultMaxNamespaceSpaces, "block spaces (model, LoRA adapter, hash scheme) the CacheBackends of one namespace may hold together in the memory store; a delta or snapshot storing into more new ones is refused with ResourceExhausted; 0: no limit")
	reviewTTL := fs.Duration("token-review-ttl", time.Minute, "how long a TokenReview verdict is reused for the same token")
	reviewQPS := fs.Float64("token-review-qps", server.DefaultReviewsPerSecond, "TokenReviews per second (and burst) for tokens whose verdict is not cached; beyond it a new token is refused until the next review is allowed")
	maxStaged := fs.Int("max-staged-blocks", kvindex.DefaultMaxStagedBlocks, "snapshot entries every stream together may stage before their ends (16 bytes each); a chunk past it drops its snapshot, whose end is refused with ResourceExhausted")
	maxStagedNS := fs.Int("max-staged-blocks-per-namespace", 0, "snapshot entries the streams of one namespace may stage together, so that no namespace takes the whole --max-staged-blocks from the others; 0 (default) is half of --max-staged-blocks; a value above --max-staged-blocks counts as --max-staged-blocks")
	maxRanks := fs.Uint("max-ranks", kvindex.DefaultMaxRanks, "data-parallel ranks one subscriber's Hello may announce; a Hello with more is refused (each rank may stage a snapshot)")
	requireBackend := fs.Bool("require-backend", true, "refuse a Hello whose CacheBackend does not exist (watches CacheBackends' metadata; default true with --auth=tokenreview, false with --auth=none)")
	development := fs.Bool("zap-devel", false, "human-readable console logs at debug level instead of JSON")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *showVersion {
		fmt.Println(version.String("cache-index"))
		return nil
	}
	if len(audiences) == 0 {
		audiences = stringList{v1alpha1.IndexTokenAudience}
	}
	requireSet := false
	fs.Visit(func(f *flag.Flag) { requireSet = requireSet || f.Name == "require-backend" })
	if !requireSet && *authMode == "none" {
		// Local development without an API server.
		*requireBackend = false
	}
	if *maxStaged < 1 {
		return fmt.Errorf("--max-staged-blocks %d: want at least 1", *maxStaged)
	}
	if *maxStagedNS < 0 {
		return fmt.Errorf("--max-staged-blocks-per-namespace %d: want 0 (half of --max-staged-blocks) or more", *maxStagedNS)
	}
	sglangBindings, err := parseSGLangIndexers(sglangIndexers)
	if err != nil {
		return err
	}
	if *maxRanks < 1 || *maxRanks > 1<<16 {
		return fmt.Errorf("--max-ranks %d: want 1 to 65536", *maxRanks)
	}
	zl, err := logging.New(*development)
	if err != nil {
		return err
	}
	log := zapr.NewLogger(zl)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	limits := kvindex.Limits{PodBlocks: *maxPodBlocks, BackendBlocks: *maxBackendBlocks, NamespaceBlocks: *maxNamespaceBlocks, NamespaceSpaces: *maxNamespaceSpaces}
	var store kvindex.Store
	var rs *redisstore.Store // store, with --store=redis
	switch *storeKind {
	case "memory":
		store = memstore.NewLimited(limits)
	case "redis":
		opt, err := redisOptions(*redisAddr, *redisCluster, *redisSentinelMaster, *redisDB)
		if err != nil {
			return err
		}
		if *redisPasswordFile != "" {
			b, err := os.ReadFile(*redisPasswordFile)
			if err != nil {
				return fmt.Errorf("reading --redis-password-file: %w", err)
			}
			opt.Password = strings.TrimSpace(string(b))
		}
		if *redisWaitReplicas < 0 {
			return fmt.Errorf("--redis-wait-replicas=%d: want 0 or more", *redisWaitReplicas)
		}
		if !*redisPlacements && !*redisReadModel {
			return errors.New("--redis-placements=false with --redis-read-model=false: queries without the read model read the placements; keep one of them")
		}
		if *redisReadModelMaxLag < 0 {
			return fmt.Errorf("--redis-read-model-max-lag=%s: want 0 or more", *redisReadModelMaxLag)
		}
		rs = redisstore.NewWithOptions(redisClient(opt), redisstore.Options{Limits: limits, WaitReplicas: *redisWaitReplicas, WaitTimeout: *redisWaitTimeout,
			NoReadModel: !*redisReadModel, ReadModelMaxLag: *redisReadModelMaxLag, NoPlacements: !*redisPlacements})
		store = rs
	default:
		return fmt.Errorf("--store=%q: want memory or redis", *storeKind)
	}
	defer func() { _ = store.Close() }()

	var authn kvindex.Authenticator
	switch *authMode {
	case "tokenreview":
		cfg, err := restConfig(*kubeconfig)
		if err != nil {
			return err
		}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return fmt.Errorf("creating the Kubernetes client: %w", err)
		}
		authn = &server.TokenReviewAuthenticator{Reviewer: cs.AuthenticationV1().TokenReviews(), Audiences: audiences, CacheTTL: *reviewTTL, ReviewsPerSecond: *reviewQPS}
	case "none":
		log.Info("authentication is off: every caller may publish and query; use only for local tests")
		authn = kvindex.AllowAll{}
	default:
		return fmt.Errorf("--auth=%q: want tokenreview or none", *authMode)
	}

	var backends kvindex.Backends
	if *requireBackend {
		cfg, err := restConfig(*kubeconfig)
		if err != nil {
			return err
		}
		md, err := metadata.NewForConfig(cfg)
		if err != nil {
			return fmt.Errorf("creating the metadata client: %w", err)
		}
		inf := server.NewBackendInformer(md)
		if err := inf.Start(ctx, time.Minute); err != nil {
			return fmt.Errorf("--require-backend: %w", err)
		}
		backends = inf
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := indexmetrics.New(reg)
	ix := kvindex.New(kvindex.Options{
		Store: metrics.Store(store), Authenticator: authn, Policy: kvindex.Policy{ClusterReaders: readers},
		Lease: *lease, Heartbeat: *heartbeat, Limits: limits, Observer: metrics, Log: log.WithName("index"),
		MaxRanks: uint32(*maxRanks), MaxStagedBlocks: *maxStaged, MaxStagedBlocksPerNamespace: *maxStagedNS, Backends: backends,
	})

	grpcLis, err := net.Listen("tcp", *grpcAddr)
	if err != nil {
		return fmt.Errorf("listening for gRPC: %w", err)
	}
	gs := grpc.NewServer(server.GRPCOptions()...)
	server.RegisterGRPC(gs, ix)
	grpcServers := []*grpc.Server{gs}
	type sglangListener struct {
		lis     net.Listener
		srv     *grpc.Server
		backend kvindex.BackendRef
	}
	var sglangListeners []sglangListener
	for _, b := range sglangBindings {
		lis, err := net.Listen("tcp", b.address)
		if err != nil {
			return fmt.Errorf("--sglang-kv-indexer %s: %w", b.backend, err)
		}
		srv := grpc.NewServer(server.GRPCOptions()...)
		server.RegisterSGLang(srv, ix, b.backend)
		grpcServers = append(grpcServers, srv)
		sglangListeners = append(sglangListeners, sglangListener{lis, srv, b.backend})
	}

	api := http.NewServeMux()
	server.HTTPHandler(ix, api)
	apiSrv := server.NewHTTPServer(*httpAddr, api)

	var ready atomic.Bool
	probes := http.NewServeMux()
	probes.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	probes.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if !ready.Load() {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		// Ready while the store answers (Redis reachable).
		if _, err := store.TierBlocks(r.Context(), kvindex.BackendRef{Namespace: "-", Name: "-"}); err != nil {
			http.Error(w, "store unavailable: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	probes.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	probeSrv := server.NewHTTPServer(*probeAddr, probes)

	errc := make(chan error, 3+len(sglangListeners))
	go func() { errc <- serve("gRPC", func() error { return gs.Serve(grpcLis) }) }()
	for _, l := range sglangListeners {
		log.Info("serving SGLang's router query without authentication", "cacheBackend", l.backend.String(), "address", l.lis.Addr().String())
		go func() {
			errc <- serve("SGLang router query for "+l.backend.String(), func() error { return l.srv.Serve(l.lis) })
		}()
	}
	go func() { errc <- serve("HTTP API", apiSrv.ListenAndServe) }()
	go func() { errc <- serve("probes", probeSrv.ListenAndServe) }()
	go ix.RunLeaseReaper(ctx, max(*lease/6, time.Second))
	if rs == nil {
		ready.Store(true)
	} else {
		// Ready once the read model holds every backend, so that no query
		// waits for one to be read.
		go func() {
			began := time.Now()
			n, err := rs.Preload(ctx)
			if err != nil {
				log.Error(err, "reading the backends into the read model; each is read at its first query instead")
			} else if n > 0 {
				log.Info("read model loaded", "backends", n, "took", time.Since(began).Round(time.Millisecond))
			}
			ready.Store(true)
		}()
	}
	log.Info("cache-index serving", "version", version.Version, "grpc", grpcLis.Addr().String(), "http", *httpAddr,
		"probes", *probeAddr, "store", *storeKind, "auth", *authMode, "audiences", []string(audiences),
		"maxRanks", *maxRanks, "requireBackend", *requireBackend)

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	ready.Store(false)
	shutdown(log, grpcServers, apiSrv, probeSrv)
	return runErr
}

func serve(name string, fn func() error) error {
	if err := fn(); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serving %s: %w", name, err)
	}
	return nil
}

func shutdown(log logr.Logger, gss []*grpc.Server, srvs ...*http.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() {
		for _, gs := range gss {
			gs.GracefulStop()
		}
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		for _, gs := range gss {
			gs.Stop()
		}
	}
	for _, s := range srvs {
		_ = s.Shutdown(ctx)
	}
	log.Info("cache-index stopped")
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		kubeconfig = os.Getenv("KUBECONFIG")
	}
	if kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
		}
		return cfg, nil
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("no --kubeconfig and not in a cluster (%w); use --auth=none only for local tests", err)
	}
	return cfg, nil
}

// redisClient is go-redis' client for opt (UniversalOptions picks the
// kind); on a cluster it reads the slots again once they are a second old,
// not go-redis' 60 s: a master that crashed answers nothing (no MOVED), so
// its slots would fail that long after its replica was promoted.
func redisClient(opt *redis.UniversalOptions) redis.UniversalClient {
	if !opt.IsClusterMode { // redisOptions sets it for every cluster
		return redis.NewUniversalClient(opt)
	}
	co := opt.Cluster()
	co.ClusterStateReloadInterval = clusterStateReload
	return redis.NewClusterClient(co)
}

// clusterStateReload is how old a cluster's slot map may grow before the
// index reads it again.
const clusterStateReload = time.Second

// redisOptions reads the --redis-* flags: one address is one server,
// several (or --redis-cluster) a cluster, --redis-sentinel-master a
// Sentinel-watched master. go-redis' UniversalClient then follows the
// cluster's slots (no MOVED reaches the store) or the elected master.
func redisOptions(addresses string, cluster bool, sentinelMaster string, db int) (*redis.UniversalOptions, error) {
	var addrs []string
	for a := range strings.SplitSeq(addresses, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("--redis-address %q: want host:port[,host:port...]", addresses)
	}
	for _, a := range addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("--redis-address %q: %w", a, err)
		}
	}
	clustered := cluster || (len(addrs) > 1 && sentinelMaster == "")
	switch {
	case sentinelMaster != "" && cluster:
		return nil, errors.New("--redis-sentinel-master and --redis-cluster: a Sentinel watches one master, not a cluster; set one of them")
	case clustered && db != 0:
		return nil, fmt.Errorf("--redis-db %d with a cluster: a Redis Cluster has database 0 only", db)
	}
	return &redis.UniversalOptions{Addrs: addrs, DB: db, MasterName: sentinelMaster, IsClusterMode: clustered,
		// CLIENT LIST names the index (Redis 7.2 and later).
		IdentitySuffix: "cache-index",
		// Maintenance notifications are Redis Enterprise's: on Redis and
		// Valkey the attempt is one ERR reply per connection.
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}}, nil
}

// sglangBinding is one --sglang-kv-indexer value.
type sglangBinding struct {
	backend kvindex.BackendRef
	address string
}

// parseSGLangIndexers reads the --sglang-kv-indexer values
// ("namespace/name=host:port"): one listener a backend, one backend a
// listener.
func parseSGLangIndexers(values []string) ([]sglangBinding, error) {
	var out []sglangBinding
	backends, addresses := map[kvindex.BackendRef]bool{}, map[string]bool{}
	for _, v := range values {
		ref, addr, ok := strings.Cut(v, "=")
		ns, name, okRef := strings.Cut(ref, "/")
		if !ok || !okRef || ns == "" || name == "" || strings.Contains(name, "/") {
			return nil, fmt.Errorf("--sglang-kv-indexer %q: want namespace/name=host:port", v)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("--sglang-kv-indexer %q: %w", v, err)
		}
		b := kvindex.BackendRef{Namespace: ns, Name: name}
		if backends[b] || addresses[addr] {
			return nil, fmt.Errorf("--sglang-kv-indexer %q: a backend and an address each take one listener", v)
		}
		backends[b], addresses[addr] = true, true
		out = append(out, sglangBinding{backend: b, address: addr})
	}
	return out, nil
}
