// Command manager runs the inferencecache operator: the CacheBackend and
// receipt controllers and the Pod injection and CacheBackend validation
// webhooks, with leader election, health and readiness endpoints and
// Prometheus metrics.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/zapr"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/certs"
	"github.com/inferencecache/operator/internal/controller"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/kvindex/indexclient"
	"github.com/inferencecache/operator/internal/logging"
	"github.com/inferencecache/operator/internal/metrics"
	"github.com/inferencecache/operator/internal/topology"
	"github.com/inferencecache/operator/internal/version"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "manager:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	metricsAddr := fs.String("metrics-bind-address", ":8443", "address the Prometheus metrics endpoint binds to; 0 disables it")
	metricsSecure := fs.Bool("metrics-secure", true, "serve metrics over HTTPS, only to clients the API server authenticates (TokenReview) and authorizes for GET /metrics (SubjectAccessReview); false serves plain HTTP to anyone who can reach the port")
	clusterDomain := fs.String("cluster-domain", topology.DefaultClusterDomain, "the cluster's DNS domain: engines are given, and the functional probe dials, <name>.<namespace>.svc.<domain>")
	maxRequest := fs.Int64("webhook-max-request-bytes", inject.DefaultMaxRequestBytes, "a larger pod admission request is admitted unwired without being decoded (fail open; metric inferencecache_webhook_guard_trips_total)")
	maxConcurrent := fs.Int("webhook-max-concurrency", inject.DefaultMaxConcurrent, "pod admissions decoded at once; the others wait until their deadline, then fail open")
	memRatio := fs.Float64("memory-limit-ratio", controller.DefaultMemoryLimitRatio, "when GOMEMLIMIT is a plain byte count (the container's memory limit, as the install bundle sets it through the downward API), use this fraction of it as the Go runtime's soft memory limit")
	probeAddr := fs.String("health-probe-bind-address", ":8081", "address the /healthz and /readyz endpoints bind to")
	leaderElect := fs.Bool("leader-elect", false, "elect a leader so that only one replica reconciles at a time")
	leaderNS := fs.String("leader-election-namespace", "", "namespace of the leader-election Lease (defaults to the pod's namespace)")
	webhookPort := fs.Int("webhook-port", 9443, "port the admission webhooks are served on")
	webhookHost := fs.String("webhook-host", "", "address the admission webhooks bind to (all addresses when empty)")
	webhookCertDir := fs.String("webhook-cert-dir", "/tmp/k8s-webhook-server/serving-certs", "folder holding the webhooks' tls.crt and tls.key; reloaded when they change")
	webhooks := fs.Bool("enable-webhooks", true, "serve the Pod injection and CacheBackend validation webhooks")
	subscriberImage := fs.String("kvevent-subscriber-image", "", "image of the kvevent-subscriber sidecar; empty (the default) never adds it")
	indexEndpoint := fs.String("kvindex-endpoint", "", "gRPC address (host:port) of the KV-block index the kvevent-subscriber sidecars forward to; empty: the install bundle's headless inferencecache-index-peers Service in --namespace, <svc>.<namespace>.svc.<cluster-domain>:9400, whose every ready replica each sidecar forwards to")
	indexURL := fs.String("kvindex-status-url", "", "HTTP base URL of the KV-block index the controller reads status.indexParticipation from; empty: the install bundle's inferencecache-index Service in --namespace, http://<svc>.<namespace>.svc.<cluster-domain>:9401")
	indexToken := fs.String("kvindex-token-file", inject.IndexTokenPath, "bearer token for the index's HTTP API (a projected ServiceAccount token of audience inferencecache-index); empty sends none")
	indexPoll := fs.Duration("kvindex-poll-interval", indexclient.DefaultPoll, "how often the participation of CacheBackends with spec.observation is re-read between reconciles")
	namespace := fs.String("namespace", envOr("POD_NAMESPACE", "inferencecache-system"), "the operator's own namespace, which holds the receipt key Secret")
	probe := fs.Bool("functional-probe", true, "before Ready=True, check that each cache server accepts TCP connections on its Service (turn off where servers do not really run, e.g. on kwok nodes)")
	probeInterval := fs.Duration("functional-probe-interval", 30*time.Second, "at most one functional probe per backend per interval")
	selfSigned := fs.Bool("self-signed-webhook-cert", false, "provision and renew the webhooks' serving certificate in a Secret and publish its CA as caBundle (the dev overlay; production uses cert-manager)")
	certSecret := fs.String("webhook-cert-secret", "inferencecache-webhook-cert", "Secret of the self-signed webhook certificate, in --namespace")
	webhookService := fs.String("webhook-service", "inferencecache-webhook", "Service in front of the webhooks; names the self-signed certificate")
	certHosts := fs.String("webhook-cert-hosts", "", "extra comma-separated DNS names or IPs for the self-signed certificate (e.g. 127.0.0.1 when the manager runs outside the cluster)")
	receiptHorizon := fs.Duration("receipt-event-horizon", controller.DefaultReceiptEventHorizon, "a manager that did not report a pod's receipt event (after a restart) reports it only while the pod is younger than this; keep it at most the API server's --event-ttl, or pods may be reported twice")
	apiQPS := fs.Float64("kube-api-qps", controller.DefaultKubeAPIQPS, "requests per second the manager's API client sends at most, averaged (client-go's rate limiter; it bounds how fast a burst of new CacheBackends becomes Ready, not what an idle operator sends: nothing)")
	apiBurst := fs.Int("kube-api-burst", controller.DefaultKubeAPIBurst, "requests the manager's API client may send at once above --kube-api-qps")
	development := fs.Bool("zap-devel", false, "human-readable console logs at debug level instead of JSON")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *showVersion {
		_, err := fmt.Fprintln(stdout, version.String("manager"))
		return err
	}

	logger, err := logging.New(*development)
	if err != nil {
		return err
	}
	ctrl.SetLogger(zapr.NewLogger(logger))
	setupLog := ctrl.Log.WithName("setup")
	if limit, applied := applyMemoryLimit(os.Getenv("GOMEMLIMIT"), *memRatio); applied {
		setupLog.Info("Go soft memory limit set from the container limit", "GOMEMLIMIT", os.Getenv("GOMEMLIMIT"), "ratio", *memRatio, "bytes", limit)
	} else {
		setupLog.Info("Go soft memory limit", "bytes", limit)
	}

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(v1alpha1.AddToScheme(scheme))

	// Every request to the API server is counted (inferencecache_apiserver_requests_total).
	restCfg := ctrl.GetConfigOrDie()
	restCfg.QPS, restCfg.Burst = float32(*apiQPS), *apiBurst
	restCfg = metrics.CountRequests(restCfg)
	var provisioner *certs.Provisioner
	if *selfSigned && *webhooks {
		direct, err := client.New(restCfg, client.Options{Scheme: scheme})
		if err != nil {
			return err
		}
		hosts := []string{*webhookService + "." + *namespace + ".svc", *webhookService + "." + *namespace + ".svc.cluster.local"}
		for _, h := range strings.Split(*certHosts, ",") {
			if h = strings.TrimSpace(h); h != "" {
				hosts = append(hosts, h)
			}
		}
		provisioner = &certs.Provisioner{
			Client: direct, Namespace: *namespace, SecretName: *certSecret, Hosts: hosts, CertDir: *webhookCertDir,
			ServeAddr:  net.JoinHostPort("127.0.0.1", strconv.Itoa(*webhookPort)),
			Mutating:   map[string][]string{"inferencecache-pod-injector": {"inject.inferencecache.io"}},
			Validating: map[string][]string{"inferencecache-cachebackend-validator": {"validate.cachebackend.inferencecache.io"}},
		}
		if err := provisioner.Ensure(context.Background()); err != nil {
			return fmt.Errorf("provisioning the webhook certificate: %w", err)
		}
	}
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                  scheme,
		Cache:                   controller.CacheOptions(),
		Metrics:                 metricsOptions(*metricsAddr, *metricsSecure),
		WebhookServer:           webhook.NewServer(webhook.Options{Host: *webhookHost, Port: *webhookPort, CertDir: *webhookCertDir}),
		HealthProbeBindAddress:  *probeAddr,
		LeaderElection:          *leaderElect,
		LeaderElectionID:        "inferencecache-operator.inferencecache.io",
		LeaderElectionNamespace: *leaderNS,
		// The lease is released on a clean shutdown so a standby takes over at once.
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return fmt.Errorf("creating manager: %w", err)
	}
	var prober *controller.Prober
	if *probe {
		prober = controller.NewProber(*probeInterval)
		prober.ClusterDomain = *clusterDomain
	}
	if err := controller.Setup(mgr, controller.Options{
		Probe:    prober,
		Webhooks: *webhooks,
		Inject: inject.Options{KVEventSubscriberImage: *subscriberImage, ClusterDomain: *clusterDomain,
			IndexEndpoint: cmp.Or(*indexEndpoint, inject.DefaultIndexEndpoint(*namespace, *clusterDomain)),
			Limits:        inject.Limits{MaxRequestBytes: *maxRequest, MaxConcurrent: *maxConcurrent}},
		Namespace:           *namespace,
		ReceiptEventHorizon: *receiptHorizon,
		Index:               indexReader(*indexURL, *indexToken, *namespace, *clusterDomain),
		IndexPoll:           *indexPoll,
	}); err != nil {
		return err
	}
	metricsLog := ctrl.Log.WithName("metrics")
	if err := metrics.Register(mgr.GetCache(), func(err error) {
		metricsLog.Error(err, "listing CacheBackends for the condition gauge")
	}); err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}
	if *webhooks {
		if err := metrics.RegisterCertificate(filepath.Join(*webhookCertDir, "tls.crt"), func(err error) {
			metricsLog.Error(err, "reading the webhook serving certificate for its expiry gauge")
		}); err != nil {
			return fmt.Errorf("registering metrics: %w", err)
		}
	}
	if provisioner != nil {
		if err := mgr.Add(provisioner); err != nil {
			return err
		}
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("adding health check: %w", err)
	}
	ready := healthz.Ping
	if *webhooks {
		// Ready only once the webhook server serves, and, with the
		// self-provisioned certificate, serves the current one.
		started := mgr.GetWebhookServer().StartedChecker()
		ready = func(r *http.Request) error {
			if err := started(r); err != nil {
				return err
			}
			if provisioner != nil {
				return provisioner.Ready(r)
			}
			return nil
		}
	}
	if err := mgr.AddReadyzCheck("webhook", ready); err != nil {
		return fmt.Errorf("adding readiness check: %w", err)
	}
	setupLog.Info("starting manager", "version", version.Version, "fieldManager", v1alpha1.FieldManagerChildren, "statusManager", v1alpha1.FieldManagerStatus)
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		return fmt.Errorf("running manager: %w", err)
	}
	return nil
}

// indexReader reads the KV-block index's HTTP API at url, by default the
// install bundle's Service.
func indexReader(url, tokenFile, namespace, domain string) controller.IndexReader {
	if url == "" {
		url = fmt.Sprintf("http://%s.%s.svc.%s:%d", v1alpha1.IndexService, namespace, domain, v1alpha1.IndexHTTPPort)
	}
	return &indexclient.HTTP{BaseURL: url, TokenFile: tokenFile}
}

// metricsOptions serves /metrics over HTTPS behind the API server's
// authentication and authorization (a bearer token checked by TokenReview,
// GET /metrics checked by SubjectAccessReview: the metrics-reader
// ClusterRole grants it), or over plain HTTP when secure is false.
func metricsOptions(addr string, secure bool) metricsserver.Options {
	if !secure {
		return metricsserver.Options{BindAddress: addr}
	}
	return metricsserver.Options{BindAddress: addr, SecureServing: true, FilterProvider: filters.WithAuthenticationAndAuthorization}
}

// applyMemoryLimit honours the container's memory limit. The install
// bundle sets GOMEMLIMIT from limits.memory through the downward API, a
// plain byte count; the Go runtime reads it at start, and this lowers it to
// ratio of the limit, leaving room for memory the runtime does not count.
// A GOMEMLIMIT with a unit (400MiB) was set by a person and is kept. It
// returns the soft limit in force and whether it changed it.
func applyMemoryLimit(env string, ratio float64) (int64, bool) {
	n, err := strconv.ParseInt(strings.TrimSpace(env), 10, 64)
	if err != nil || n <= 0 || ratio <= 0 || ratio >= 1 {
		return debug.SetMemoryLimit(-1), false
	}
	limit := int64(float64(n) * ratio)
	debug.SetMemoryLimit(limit)
	return limit, true
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
