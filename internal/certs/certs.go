// Package certs provisions the webhooks' serving certificate when no
// cert-manager is installed (the dev overlay): a long-lived CA and a
// serving certificate signed by it, kept in one Secret of the operator's
// namespace. Every replica (not only the leader) reads the Secret, writes
// the certificate to its webhook server's folder (which controller-runtime's
// certificate watcher reloads) and publishes the CA as the webhook
// configurations' caBundle through server-side apply with a field manager of
// its own. Renewal replaces only the serving certificate, under the same CA,
// so a replica still serving the previous one stays trusted until it syncs.
package certs

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// +kubebuilder:rbac:groups="",namespace=inferencecache-system,resources=secrets,verbs=create
// +kubebuilder:rbac:groups="",namespace=inferencecache-system,resources=secrets,resourceNames=inferencecache-webhook-cert,verbs=get;update
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=mutatingwebhookconfigurations,resourceNames=inferencecache-pod-injector,verbs=get;patch
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingwebhookconfigurations,resourceNames=inferencecache-cachebackend-validator,verbs=get;patch

// CABundleManager is the field manager of the caBundle fields it sets.
const CABundleManager = "inferencecache-operator-cabundle"

// Lifetimes: the serving certificate is renewed when less than renewBefore
// of it is left; the CA lives ten years and is replaced (with every
// serving certificate) only when less than caRenewBefore is left.
const (
	validity      = 365 * 24 * time.Hour
	renewBefore   = 30 * 24 * time.Hour
	caValidity    = 10 * 365 * 24 * time.Hour
	caRenewBefore = 365 * 24 * time.Hour
	// Secret keys of the CA (ca.crt is published, ca.key never leaves the Secret).
	caCertKey = "ca.crt"
	caKeyKey  = "ca.key"
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
	// Check is how often every replica reads the Secret to renew or pick up
	// a renewal (1 min when zero).
	Check time.Duration
	// ServeAddr, when set, is the webhook server's host:port: Ready then
	// checks that it serves the current certificate.
	ServeAddr string

	mu      sync.Mutex
	current *x509.Certificate // the serving certificate last written
	caPool  *x509.CertPool
}

// Ensure makes the Secret hold a CA and a valid serving certificate for
// Hosts signed by it, writes the certificate to CertDir and publishes the
// CA as caBundle. Replicas race safely: a create or update that loses
// (AlreadyExists, Conflict) reads the winner's Secret and uses it.
func (p *Provisioner) Ensure(ctx context.Context) error {
	return p.ensure(ctx, false)
}

// Renew issues a new serving certificate under the current CA now, as a
// renewal before expiry does.
func (p *Provisioner) Renew(ctx context.Context) error {
	return p.ensure(ctx, true)
}

func (p *Provisioner) ensure(ctx context.Context, force bool) error {
	key := client.ObjectKey{Namespace: p.Namespace, Name: p.SecretName}
	s := &corev1.Secret{}
	err := p.Client.Get(ctx, key, s)
	switch {
	case apierrors.IsNotFound(err):
		s = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.SecretName,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "inferencecache-operator"}}, Type: corev1.SecretTypeTLS}
		if _, err := p.fill(s); err != nil {
			return err
		}
		if err := p.Client.Create(ctx, s); err != nil {
			if !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("creating webhook certificate secret: %w", err)
			}
			// Another replica was first: use its certificate.
			if err := p.Client.Get(ctx, key, s); err != nil {
				return fmt.Errorf("reading webhook certificate secret: %w", err)
			}
		}
	case err != nil:
		return fmt.Errorf("reading webhook certificate secret: %w", err)
	case force || p.needsRenewal(s):
		newCA, err := p.fill(s)
		if err != nil {
			return err
		}
		log.FromContext(ctx).Info("renewing the webhook serving certificate", "secret", p.Namespace+"/"+p.SecretName, "newCA", newCA)
		if err := p.Client.Update(ctx, s); err != nil {
			if !apierrors.IsConflict(err) {
				return fmt.Errorf("renewing webhook certificate: %w", err)
			}
			// Another replica renewed it first: use its certificate.
			if err := p.Client.Get(ctx, key, s); err != nil {
				return fmt.Errorf("reading webhook certificate secret: %w", err)
			}
		}
	}
	if err := p.write(s); err != nil {
		return err
	}
	return p.publish(ctx, s.Data[caCertKey])
}

// Start keeps the certificate while the manager runs, on every replica.
func (p *Provisioner) Start(ctx context.Context) error {
	every := p.Check
	if every == 0 {
		every = time.Minute
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := p.Ensure(ctx); err != nil {
				log.FromContext(ctx).Error(err, "keeping the webhook serving certificate", "secret", p.Namespace+"/"+p.SecretName)
			}
		}
	}
}

// NeedLeaderElection is false: every replica serves webhooks, so every
// replica syncs its certificate (manager.LeaderElectionRunnable).
func (p *Provisioner) NeedLeaderElection() bool { return false }

// Ready is a readiness check (healthz.Checker): the certificate was
// written, is valid now and signed by the CA in the Secret, and, with
// ServeAddr, the webhook server presents exactly it.
func (p *Provisioner) Ready(_ *http.Request) error {
	p.mu.Lock()
	cur, pool := p.current, p.caPool
	p.mu.Unlock()
	if cur == nil {
		return errors.New("no webhook serving certificate written yet")
	}
	now := time.Now()
	if now.After(cur.NotAfter) || now.Before(cur.NotBefore) {
		return fmt.Errorf("the webhook serving certificate expired at %s", cur.NotAfter)
	}
	if _, err := cur.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return fmt.Errorf("the webhook serving certificate is not signed by the published CA: %w", err)
	}
	if p.ServeAddr == "" {
		return nil
	}
	d := &tls.Dialer{Config: &tls.Config{RootCAs: pool, ServerName: p.Hosts[0], MinVersion: tls.VersionTLS12}, NetDialer: &net.Dialer{Timeout: 2 * time.Second}}
	conn, err := d.Dial("tcp", p.ServeAddr)
	if err != nil {
		return fmt.Errorf("the webhook server does not serve a certificate the published CA trusts: %w", err)
	}
	defer conn.Close()
	if peer := conn.(*tls.Conn).ConnectionState().PeerCertificates; len(peer) == 0 || !peer[0].Equal(cur) {
		return errors.New("the webhook server still serves the previous certificate")
	}
	return nil
}

func (p *Provisioner) needsRenewal(s *corev1.Secret) bool {
	ca, _, err := parseCA(s)
	if err != nil || time.Until(ca.NotAfter) < caRenewBefore {
		return true
	}
	block, _ := pem.Decode(s.Data[corev1.TLSCertKey])
	if block == nil || len(s.Data[corev1.TLSPrivateKeyKey]) == 0 {
		return true
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil || time.Until(cert.NotAfter) < renewBefore || cert.CheckSignatureFrom(ca) != nil {
		return true
	}
	for _, h := range p.Hosts {
		if cert.VerifyHostname(h) != nil {
			return true
		}
	}
	return false
}

// fill issues a serving certificate under the Secret's CA, generating a
// CA first only when the Secret has none that is valid for long enough.
// It reports whether it made a new CA.
func (p *Provisioner) fill(s *corev1.Secret) (bool, error) {
	ca, caKey, err := parseCA(s)
	newCA := err != nil || time.Until(ca.NotAfter) < caRenewBefore
	if newCA {
		if ca, caKey, err = newAuthority(caValidity); err != nil {
			return false, err
		}
	}
	crt, key, err := issue(ca, caKey, p.Hosts, validity)
	if err != nil {
		return false, err
	}
	kb, err := x509.MarshalECPrivateKey(caKey)
	if err != nil {
		return false, err
	}
	s.Data = map[string][]byte{
		caCertKey:         pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw}),
		caKeyKey:          pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}),
		corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key,
	}
	return newCA, nil
}

// parseCA reads the CA certificate and key from the Secret.
func parseCA(s *corev1.Secret) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	cb, _ := pem.Decode(s.Data[caCertKey])
	kb, _ := pem.Decode(s.Data[caKeyKey])
	if cb == nil || kb == nil {
		return nil, nil, errors.New("no CA in the secret")
	}
	ca, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	if !key.PublicKey.Equal(ca.PublicKey) {
		return nil, nil, errors.New("the CA key does not match the CA certificate")
	}
	return ca, key, nil
}

// Generate makes a CA and a serving certificate for hosts (DNS names or IP
// addresses) signed by it, valid for the given time; it returns the CA
// certificate, the serving certificate and its key, PEM-encoded.
func Generate(hosts []string, valid time.Duration) (caPEM, certPEM, keyPEM []byte, err error) {
	ca, caKey, err := newAuthority(valid + renewBefore)
	if err != nil {
		return nil, nil, nil, err
	}
	crt, key, err := issue(ca, caKey, hosts, valid)
	if err != nil {
		return nil, nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw}), crt, key, nil
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// newAuthority makes a self-signed CA valid for the given time.
func newAuthority(valid time.Duration) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn, Subject: pkix.Name{CommonName: "inferencecache-webhook-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(valid),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	ca, err := x509.ParseCertificate(der)
	return ca, caKey, err
}

// issue signs a serving certificate for hosts with the CA; it returns the
// certificate and its key, PEM-encoded.
func issue(ca *x509.Certificate, caKey *ecdsa.PrivateKey, hosts []string, valid time.Duration) ([]byte, []byte, error) {
	now := time.Now()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn, Subject: pkix.Name{CommonName: hosts[0]},
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
		return nil, nil, err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), nil
}

// write puts tls.crt and tls.key into CertDir when they differ, through a
// rename so the certificate watcher never reads half a file, and records
// them for Ready.
func (p *Provisioner) write(s *corev1.Secret) error {
	block, _ := pem.Decode(s.Data[corev1.TLSCertKey])
	if block == nil {
		return errors.New("the webhook certificate secret holds no tls.crt")
	}
	cur, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return fmt.Errorf("parsing the webhook serving certificate: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(s.Data[caCertKey]) {
		return errors.New("the webhook certificate secret holds no ca.crt")
	}
	defer func() {
		p.mu.Lock()
		p.current, p.caPool = cur, pool
		p.mu.Unlock()
	}()
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
