// Command manager runs the inferencecache operator: the CacheBackend and
// receipt controllers and the Pod injection and CacheBackend validation
// webhooks, with leader election, health and readiness endpoints and
// Prometheus metrics.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/apply"
	"github.com/inferencecache/operator/internal/certs"
	"github.com/inferencecache/operator/internal/controller"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/metrics"
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
	metricsAddr := fs.String("metrics-bind-address", ":8080", "address the Prometheus metrics endpoint binds to; 0 disables it")
	probeAddr := fs.String("health-probe-bind-address", ":8081", "address the /healthz and /readyz endpoints bind to")
	leaderElect := fs.Bool("leader-elect", false, "elect a leader so that only one replica reconciles at a time")
	leaderNS := fs.String("leader-election-namespace", "", "namespace of the leader-election Lease (defaults to the pod's namespace)")
	webhookPort := fs.Int("webhook-port", 9443, "port the admission webhooks are served on")
	webhookHost := fs.String("webhook-host", "", "address the admission webhooks bind to (all addresses when empty)")
	webhookCertDir := fs.String("webhook-cert-dir", "/tmp/k8s-webhook-server/serving-certs", "folder holding the webhooks' tls.crt and tls.key; reloaded when they change")
	webhooks := fs.Bool("enable-webhooks", true, "serve the Pod injection and CacheBackend validation webhooks")
	subscriberImage := fs.String("kvevent-subscriber-image", "", "image of the kvevent-subscriber sidecar; empty (the default) never adds it")
	namespace := fs.String("namespace", envOr("POD_NAMESPACE", "inferencecache-system"), "the operator's own namespace, which holds the receipt key Secret")
	probe := fs.Bool("functional-probe", true, "before Ready=True, check that each cache server accepts TCP connections on its Service (turn off where servers do not really run, e.g. on kwok nodes)")
	probeInterval := fs.Duration("functional-probe-interval", 30*time.Second, "at most one functional probe per backend per interval")
	selfSigned := fs.Bool("self-signed-webhook-cert", false, "provision and renew the webhooks' serving certificate in a Secret and publish its CA as caBundle (the dev overlay; production uses cert-manager)")
	certSecret := fs.String("webhook-cert-secret", "inferencecache-webhook-cert", "Secret of the self-signed webhook certificate, in --namespace")
	webhookService := fs.String("webhook-service", "inferencecache-webhook", "Service in front of the webhooks; names the self-signed certificate")
	certHosts := fs.String("webhook-cert-hosts", "", "extra comma-separated DNS names or IPs for the self-signed certificate (e.g. 127.0.0.1 when the manager runs outside the cluster)")
	development := fs.Bool("zap-devel", false, "human-readable console logs at debug level instead of JSON")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *showVersion {
		_, err := fmt.Fprintln(stdout, version.String("manager"))
		return err
	}

	logger, err := newLogger(*development)
	if err != nil {
		return err
	}
	ctrl.SetLogger(zapr.NewLogger(logger))
	setupLog := ctrl.Log.WithName("setup")

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(v1alpha1.AddToScheme(scheme))

	restCfg := ctrl.GetConfigOrDie()
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
			Mutating:   map[string][]string{"inferencecache-pod-injector": {"inject.inferencecache.io"}},
			Validating: map[string][]string{"inferencecache-cachebackend-validator": {"validate.cachebackend.inferencecache.io"}},
		}
		if err := provisioner.Ensure(context.Background()); err != nil {
			return fmt.Errorf("provisioning the webhook certificate: %w", err)
		}
	}
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: *metricsAddr},
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
	}
	if err := controller.Setup(mgr, controller.Options{
		Probe:     prober,
		Webhooks:  *webhooks,
		Inject:    inject.Options{KVEventSubscriberImage: *subscriberImage},
		Namespace: *namespace,
	}); err != nil {
		return err
	}
	metricsLog := ctrl.Log.WithName("metrics")
	if err := metrics.Register(mgr.GetCache(), func(err error) {
		metricsLog.Error(err, "listing CacheBackends for the condition gauge")
	}); err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}
	if provisioner != nil {
		if err := mgr.Add(provisioner); err != nil {
			return err
		}
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("adding health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return fmt.Errorf("adding readiness check: %w", err)
	}
	setupLog.Info("starting manager", "version", version.Version, "fieldManager", apply.FieldManager, "statusManager", controller.StatusManager)
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		return fmt.Errorf("running manager: %w", err)
	}
	return nil
}

func newLogger(development bool) (*zap.Logger, error) {
	if development {
		return zap.NewDevelopment()
	}
	cfg := zap.NewProductionConfig()
	cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	return cfg.Build()
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
