package certs_test

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/internal/certs"
	"github.com/inferencecache/operator/test/integration/suite"
)

// TestSelfSignedWebhookCertificate: without cert-manager the manager keeps
// its serving certificate in a Secret, writes it for the webhook server,
// publishes the CA as caBundle with its own field manager, leaves a valid
// certificate alone and renews one that no longer fits.
func TestSelfSignedWebhookCertificate(t *testing.T) {
	ctx := context.Background()
	none := admissionregistrationv1.SideEffectClassNone
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "cabundle-test"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: "x.inferencecache.io", AdmissionReviewVersions: []string{"v1"}, SideEffects: &none,
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://127.0.0.1:1/x")},
		}},
	}
	require.NoError(t, suite.K8s.Create(ctx, mwc))
	dir := t.TempDir()
	p := &certs.Provisioner{
		Client: suite.K8s, Namespace: suite.OperatorNamespace, SecretName: "cabundle-test-cert",
		Hosts: []string{"inferencecache-webhook.inferencecache-system.svc", "127.0.0.1"}, CertDir: dir,
		Mutating: map[string][]string{"cabundle-test": {"x.inferencecache.io"}},
	}
	require.NoError(t, p.Ensure(ctx))

	secret := &corev1.Secret{}
	require.NoError(t, suite.K8s.Get(ctx, client.ObjectKey{Namespace: suite.OperatorNamespace, Name: "cabundle-test-cert"}, secret))
	crt, err := os.ReadFile(filepath.Join(dir, "tls.crt"))
	require.NoError(t, err)
	assert.Equal(t, secret.Data["tls.crt"], crt)
	require.NoError(t, suite.K8s.Get(ctx, client.ObjectKey{Name: "cabundle-test"}, mwc))
	assert.Equal(t, secret.Data["ca.crt"], mwc.Webhooks[0].ClientConfig.CABundle)
	assert.Contains(t, suite.Managers(mwc), certs.CABundleManager+"/Apply")
	block, _ := pem.Decode(crt)
	cert, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	assert.NoError(t, cert.VerifyHostname("127.0.0.1"))

	rv := secret.ResourceVersion
	require.NoError(t, p.Ensure(ctx))
	require.NoError(t, suite.K8s.Get(ctx, client.ObjectKeyFromObject(secret), secret))
	assert.Equal(t, rv, secret.ResourceVersion, "a valid certificate is left alone")

	p.Hosts = append(p.Hosts, "webhook.example.test")
	require.NoError(t, p.Ensure(ctx))
	require.NoError(t, suite.K8s.Get(ctx, client.ObjectKeyFromObject(secret), secret))
	assert.NotEqual(t, rv, secret.ResourceVersion, "a certificate that no longer fits is renewed")
	require.NoError(t, suite.K8s.Get(ctx, client.ObjectKey{Name: "cabundle-test"}, mwc))
	assert.Equal(t, secret.Data["ca.crt"], mwc.Webhooks[0].ClientConfig.CABundle, "the new CA is published")
}
