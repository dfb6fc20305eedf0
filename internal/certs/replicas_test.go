package certs_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/inferencecache/operator/internal/certs"
)

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestTwoReplicasSurviveRenewal runs two certificate provisioners and two
// webhook servers (two manager replicas) against a real API server. An
// admission client that trusts only the caBundle published on the webhook
// configuration completes TLS handshakes with both replicas before, during
// and after a forced renewal by one of them: the CA stays, only the serving
// certificate changes, and the other replica picks it up on its own.
func TestTwoReplicasSurviveRenewal(t *testing.T) {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		assets = os.Getenv("CONTROLPLANE_DIR")
	}
	require.NotEmpty(t, assets, "set KUBEBUILDER_ASSETS (or CONTROLPLANE_DIR) to the control-plane binaries (make controlplane)")
	env := &envtest.Environment{BinaryAssetsDirectory: assets}
	cfg, err := env.Start()
	require.NoError(t, err)
	t.Cleanup(func() { _ = env.Stop() })
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	k8s, err := client.New(cfg, client.Options{Scheme: scheme})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ns, mwcName, hook = "inferencecache-system", "inferencecache-pod-injector", "inject.inferencecache.io"
	require.NoError(t, k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	none := admissionregistrationv1.SideEffectClassNone
	require.NoError(t, k8s.Create(ctx, &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: mwcName},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: hook, AdmissionReviewVersions: []string{"v1"}, SideEffects: &none,
			FailurePolicy:     ptr.To(admissionregistrationv1.Ignore),
			ClientConfig:      admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://127.0.0.1:1/x")},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"never": "matches"}},
		}},
	}))

	type replica struct {
		p    *certs.Provisioner
		addr string
	}
	var replicas []replica
	for i := range 2 {
		port := freePort(t)
		p := &certs.Provisioner{
			Client: k8s, Namespace: ns, SecretName: "inferencecache-webhook-cert",
			Hosts: []string{"localhost", "127.0.0.1"}, CertDir: t.TempDir(), Check: 200 * time.Millisecond,
			Mutating:  map[string][]string{mwcName: {hook}},
			ServeAddr: fmt.Sprintf("127.0.0.1:%d", port),
		}
		require.NoError(t, p.Ensure(ctx), "replica %d", i)
		srv := webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: port, CertDir: p.CertDir})
		srv.Register("/x", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
		go func() { _ = srv.Start(ctx) }()
		go func() { _ = p.Start(ctx) }()
		assert.False(t, p.NeedLeaderElection(), "every replica keeps its certificate, not only the leader")
		replicas = append(replicas, replica{p, p.ServeAddr})
	}

	published := func() *x509.CertPool {
		mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
		require.NoError(t, k8s.Get(ctx, client.ObjectKey{Name: mwcName}, mwc))
		pool := x509.NewCertPool()
		require.True(t, pool.AppendCertsFromPEM(mwc.Webhooks[0].ClientConfig.CABundle), "caBundle published")
		return pool
	}
	handshake := func(addr string) (*x509.Certificate, error) {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", addr,
			&tls.Config{RootCAs: published(), ServerName: "localhost", MinVersion: tls.VersionTLS12})
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0], nil
	}
	waitServing := func(addr string) *x509.Certificate {
		for range 200 {
			if c, err := handshake(addr); err == nil {
				return c
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("replica %s never served", addr)
		return nil
	}
	before := []*x509.Certificate{waitServing(replicas[0].addr), waitServing(replicas[1].addr)}
	assert.True(t, before[0].Equal(before[1]), "both replicas serve the certificate of the shared Secret")

	var failures []error
	var mu sync.Mutex
	handshakes := 0
	check := func() []*x509.Certificate {
		var served []*x509.Certificate
		for _, r := range replicas {
			c, err := handshake(r.addr)
			mu.Lock()
			handshakes++
			if err != nil {
				failures = append(failures, fmt.Errorf("%s: %w", r.addr, err))
			}
			mu.Unlock()
			served = append(served, c)
		}
		return served
	}
	check()
	require.NoError(t, replicas[0].p.Renew(ctx), "forced renewal on replica 0 (the leader, say)")
	renewed := false
	for range 200 {
		served := check()
		if served[0] != nil && served[1] != nil && !served[0].Equal(before[0]) && served[0].Equal(served[1]) {
			renewed = true
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for range 5 {
		check()
	}
	assert.True(t, renewed, "both replicas serve the renewed certificate")
	assert.Empty(t, failures, "every handshake with either replica verifies against the published caBundle (%d handshakes)", handshakes)
	t.Logf("%d handshakes, %d failed", handshakes, len(failures))
	for i, r := range replicas {
		assert.NoError(t, r.p.Ready(nil), "replica %d ready with the current certificate", i)
	}
}
