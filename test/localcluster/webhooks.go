package localcluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/internal/certs"
)

// WebhookServing writes a serving certificate for 127.0.0.1 as tls.crt and
// tls.key into dir (controller-runtime's webhook CertDir layout), made by
// the same generator as the manager's own certificates, and returns its CA,
// to use as the configurations' caBundle.
func WebhookServing(dir string) ([]byte, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ca, crt, key, err := certs.Generate([]string{"127.0.0.1", "localhost"}, 365*24*time.Hour)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), crt, 0o600); err != nil {
		return nil, err
	}
	return ca, os.WriteFile(filepath.Join(dir, "tls.key"), key, 0o600)
}

// certManagerInjectCA is cert-manager's CA injector annotation.
const certManagerInjectCA = "cert-manager.io/inject-ca-from"

// InstallWebhooks points the given webhook configurations at a webhook
// server on baseURL (https://127.0.0.1:<port>), trusting caPEM, and creates
// them.
func InstallWebhooks(ctx context.Context, cfg *rest.Config, baseURL string, caPEM []byte,
	mwc []*admissionregistrationv1.MutatingWebhookConfiguration, vwc []*admissionregistrationv1.ValidatingWebhookConfiguration) error {
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return err
	}
	point := func(cc *admissionregistrationv1.WebhookClientConfig) {
		path := ""
		if cc.Service != nil && cc.Service.Path != nil {
			path = *cc.Service.Path
		}
		url := baseURL + path
		cc.Service, cc.URL, cc.CABundle = nil, &url, caPEM
	}
	// The configurations carry their CA themselves: cert-manager's CA
	// injection, which the install bundle asks for, does not apply (and
	// `kubectl cachebackend check` would ask for cert-manager).
	for _, m := range mwc {
		delete(m.Annotations, certManagerInjectCA)
		for i := range m.Webhooks {
			point(&m.Webhooks[i].ClientConfig)
		}
		if err := c.Create(ctx, m); err != nil {
			return fmt.Errorf("creating %s: %w", m.Name, err)
		}
	}
	for _, v := range vwc {
		delete(v.Annotations, certManagerInjectCA)
		for i := range v.Webhooks {
			point(&v.Webhooks[i].ClientConfig)
		}
		if err := c.Create(ctx, v); err != nil {
			return fmt.Errorf("creating %s: %w", v.Name, err)
		}
	}
	return nil
}

// WaitServing waits until a TLS server completes a handshake on addr.
func WaitServing(ctx context.Context, addr string, timeout time.Duration) error {
	return Poll(ctx, timeout, func() error {
		d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: time.Second}, Config: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // a readiness probe, not a client
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return conn.Close()
	})
}
