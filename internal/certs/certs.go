// Package certs provisions the webhooks' serving certificate when no
// cert-manager is installed (the dev overlay): a CA and a serving
// certificate kept in one Secret of the operator's namespace, shared by all
// replicas, written to the webhook server's certificate folder (which
// controller-runtime's certificate watcher reloads), renewed before it
// expires, and the CA published as the webhook configurations' caBundle
// through server-side apply with a field manager of its own.
package certs

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// +kubebuilder:rbac:groups="",namespace=inferencecache-system,resources=secrets,verbs=get;create;update
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=mutatingwebhookconfigurations,resourceNames=inferencecache-pod-injector,verbs=get;patch
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingwebhookconfigurations,resourceNames=inferencecache-cachebackend-validator,verbs=get;patch

// CABundleManager is the field manager of the caBundle fields it sets.
const CABundleManager = "inferencecache-operator-cabundle"

// Lifetimes: the serving certificate is renewed when less than renewBefore
// of it is left.
const (
	validity    = 365 * 24 * time.Hour
	renewBefore = 30 * 24 * time.Hour
)

// Provisioner keeps the serving certificate. Client must read live (not a
// cache): it runs before the manager's caches start.
type Provisioner struct {
	Client     client.Client
	Namespace  string
	SecretName string
	// Hosts are the certificate's DNS names and IP addresses.
	Hosts   []string
	CertDir string
	// Mutating and Validating name the webhook configurations whose
	// caBundle is set, with the names of their webhooks.
	Mutating   map[string][]string
	Validating map[string][]string
	// Check is how often the certificate is looked at (1 h when zero).
	Check time.Duration
}

// Ensure makes the Secret hold a valid certificate for Hosts, writes it to
// CertDir and publishes the CA as caBundle.
func (p *Provisioner) Ensure(ctx context.Context) error {
	s := &corev1.Secret{}
	err := p.Client.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: p.SecretName}, s)
	switch {
	case apierrors.IsNotFound(err):
		s = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.SecretName,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "inferencecache-operator"}}, Type: corev1.SecretTypeTLS}
		if err := p.fill(s); err != nil {
			return err
		}
		if err := p.Client.Create(ctx, s); err != nil {
			if !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("creating webhook certificate secret: %w", err)
			}
			// Another replica was first: use its certificate.
			if err := p.Client.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
				return err
			}
		}
	case err != nil:
		return fmt.Errorf("reading webhook certificate secret: %w", err)
	case p.needsRenewal(s):
		log.FromContext(ctx).Info("renewing the webhook serving certificate", "secret", p.Namespace+"/"+p.SecretName)
		if err := p.fill(s); err != nil {
			return err
		}
		if err := p.Client.Update(ctx, s); err != nil {
			return fmt.Errorf("renewing webhook certificate: %w", err)
		}
	}
	if err := p.write(s); err != nil {
		return err
	}
	return p.publish(ctx, s.Data["ca.crt"])
}

// Start renews the certificate while the manager runs.
func (p *Provisioner) Start(ctx context.Context) error {
	every := p.Check
	if every == 0 {
		every = time.Hour
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := p.Ensure(ctx); err != nil {
				log.FromContext(ctx).Error(err, "keeping the webhook serving certificate")
			}
		}
	}
}

func (p *Provisioner) needsRenewal(s *corev1.Secret) bool {
	block, _ := pem.Decode(s.Data[corev1.TLSCertKey])
	if block == nil || len(s.Data["ca.crt"]) == 0 || len(s.Data[corev1.TLSPrivateKeyKey]) == 0 {
		return true
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil || time.Until(cert.NotAfter) < renewBefore {
		return true
	}
	for _, h := range p.Hosts {
		if cert.VerifyHostname(h) != nil {
			return true
		}
	}
	return false
}

// fill generates a CA and a serving certificate signed by it.
func (p *Provisioner) fill(s *corev1.Secret) error {
	ca, crt, key, err := Generate(p.Hosts, validity)
	if err != nil {
		return err
	}
	s.Data = map[string][]byte{"ca.crt": ca, corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key}
	return nil
}

// Generate makes a CA and a serving certificate for hosts (DNS names or IP
// addresses) signed by it, valid for the given time; it returns the CA
// certificate, the serving certificate and its key, PEM-encoded.
func Generate(hosts []string, valid time.Duration) (caPEM, certPEM, keyPEM []byte, err error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()), Subject: pkix.Name{CommonName: "inferencecache-webhook-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(valid + renewBefore),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano() + 1), Subject: pkix.Name{CommonName: hosts[0]},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(valid),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), nil
}

// write puts tls.crt and tls.key into CertDir when they differ, through a
// rename so the certificate watcher never reads half a file.
func (p *Provisioner) write(s *corev1.Secret) error {
	if err := os.MkdirAll(p.CertDir, 0o700); err != nil {
		return err
	}
	for _, name := range []string{corev1.TLSPrivateKeyKey, corev1.TLSCertKey} {
		path := filepath.Join(p.CertDir, name)
		if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, s.Data[name]) {
			continue
		}
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, s.Data[name], 0o600); err != nil {
			return err
		}
		if err := os.Rename(tmp, path); err != nil {
			return err
		}
	}
	return nil
}

// publish sets caBundle on every named webhook with server-side apply.
func (p *Provisioner) publish(ctx context.Context, ca []byte) error {
	apply := func(kind, name string, hooks []string) error {
		var whs []any
		for _, h := range hooks {
			whs = append(whs, map[string]any{"name": h, "clientConfig": map[string]any{"caBundle": ca}})
		}
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
			"metadata": map[string]any{"name": name}, "webhooks": whs,
		}}
		if err := p.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(CABundleManager), client.ForceOwnership); err != nil {
			return fmt.Errorf("publishing caBundle on %s %s: %w", kind, name, err)
		}
		return nil
	}
	for name, hooks := range p.Mutating {
		if err := apply("MutatingWebhookConfiguration", name, hooks); err != nil {
			return err
		}
	}
	for name, hooks := range p.Validating {
		if err := apply("ValidatingWebhookConfiguration", name, hooks); err != nil {
			return err
		}
	}
	return nil
}
