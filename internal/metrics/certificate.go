package metrics

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

var certificateExpiryDesc = prometheus.NewDesc(CertificateExpiryName,
	"When the webhooks' serving certificate (the first in tls.crt of the webhook certificate folder) expires, in seconds since the epoch.",
	nil, nil)

// CertificateCollector emits when the webhook serving certificate expires,
// read from File at scrape time: the file the webhook server's
// certificate watcher reloads, whether cert-manager mounts it or the
// manager's own provisioner (internal/certs) writes it. controller-runtime
// exports only read counts (certwatcher_read_certificate_total).
type CertificateCollector struct {
	// File is the PEM certificate chain, <webhook-cert-dir>/tls.crt.
	File string
	// OnError, when set, is told about a file that could not be read or
	// parsed; the scrape then has no expiry series.
	OnError func(error)
}

// RegisterCertificate adds a CertificateCollector reading file to
// controller-runtime's registry.
func RegisterCertificate(file string, onError func(error)) error {
	return ctrlmetrics.Registry.Register(&CertificateCollector{File: file, OnError: onError})
}

// Describe implements prometheus.Collector.
func (c *CertificateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- certificateExpiryDesc }

// Collect implements prometheus.Collector.
func (c *CertificateCollector) Collect(ch chan<- prometheus.Metric) {
	cert, err := readCertificate(c.File)
	if err != nil {
		if c.OnError != nil {
			c.OnError(err)
		}
		return
	}
	ch <- prometheus.MustNewConstMetric(certificateExpiryDesc, prometheus.GaugeValue, float64(cert.NotAfter.Unix()))
}

func readCertificate(file string) (*x509.Certificate, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading the webhook certificate: %w", err)
	}
	block, _ := pem.Decode(raw)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("the webhook certificate file holds no PEM certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parsing the webhook certificate: %w", err)
	}
	return cert, nil
}
