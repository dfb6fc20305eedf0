package metrics_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferencecache/operator/internal/metrics"
)

func certificatePEM(t *testing.T, notAfter time.Time) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "inferencecache-webhook"},
		NotBefore: notAfter.Add(-time.Hour), NotAfter: notAfter}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// TestCertificateExpiry: the gauge is the NotAfter of the first
// certificate in the file, read at every scrape (a renewal shows at the
// next one); a missing or unparsable file is reported and leaves no series.
func TestCertificateExpiry(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tls.crt")
	var errs []error
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(&metrics.CertificateCollector{File: file, OnError: func(err error) { errs = append(errs, err) }}))
	want := func(notAfter time.Time) string {
		return `
# HELP inferencecache_webhook_certificate_expiry_timestamp_seconds When the webhooks' serving certificate (the first in tls.crt of the webhook certificate folder) expires, in seconds since the epoch.
# TYPE inferencecache_webhook_certificate_expiry_timestamp_seconds gauge
inferencecache_webhook_certificate_expiry_timestamp_seconds ` + strconv.FormatInt(notAfter.Unix(), 10) + "\n"
	}

	for _, tc := range []struct {
		name     string
		contents []byte // nil: no file
		notAfter time.Time
		wantErr  string
	}{
		{name: "no file", wantErr: "reading the webhook certificate"},
		{name: "not PEM", contents: []byte("garbage"), wantErr: "no PEM certificate"},
		{name: "a certificate", notAfter: time.Unix(1_900_000_000, 0)},
		{name: "renewed", notAfter: time.Unix(1_930_000_000, 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs = nil
			switch {
			case tc.contents != nil:
				require.NoError(t, os.WriteFile(file, tc.contents, 0o600))
			case !tc.notAfter.IsZero():
				require.NoError(t, os.WriteFile(file, certificatePEM(t, tc.notAfter), 0o600))
			}
			if tc.wantErr != "" {
				n, err := testutil.GatherAndCount(reg)
				require.NoError(t, err)
				assert.Zero(t, n)
				require.Len(t, errs, 1)
				assert.Contains(t, errs[0].Error(), tc.wantErr)
				return
			}
			require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want(tc.notAfter))))
			assert.Empty(t, errs)
		})
	}
}
