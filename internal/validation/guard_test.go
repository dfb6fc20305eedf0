package validation

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// countingReader counts the bytes the server reads of a request body.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// served is the CacheBackend webhook as the manager serves it
// (internal/controller/setup.go), counting the requests that reach the
// handler.
func served(t *testing.T, reached *atomic.Int64, block <-chan struct{}) http.Handler {
	scheme := runtime.NewScheme()
	require.NoError(t, v1alpha1.AddToScheme(scheme))
	h := &webhook.Admission{Handler: &Handler{Decoder: admission.NewDecoder(scheme)}}
	return Guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		if block != nil {
			<-block
		}
		h.ServeHTTP(w, r)
	}), 0, 0)
}

func reviewBody(t *testing.T, cb *v1alpha1.CacheBackend) []byte {
	raw, err := json.Marshal(cb)
	require.NoError(t, err)
	out, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: types.UID("u-1"), Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}}})
	require.NoError(t, err)
	return out
}

// TestCacheBackendWebhookRefusesOversizedRequestsUndecoded: issue 35. A
// request above MaxRequestBytes is refused having read at most the limit
// (none of it when its length is declared), and never reaches the
// decoder; a normal one is decided.
func TestCacheBackendWebhookRefusesOversizedRequestsUndecoded(t *testing.T) {
	var reached atomic.Int64
	h := served(t, &reached, nil)

	rec := httptest.NewRecorder()
	small := httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(reviewBody(t, lmcacheBackend(nil, false))))
	small.Header.Set("Content-Type", "application/json")
	h.ServeHTTP(rec, small)
	var out admissionv1.AdmissionReview
	require.NoError(t, json.NewDecoder(rec.Body).Decode(&out), rec.Body.String())
	require.NotNil(t, out.Response)
	assert.True(t, out.Response.Allowed, out.Response.Result)
	require.EqualValues(t, 1, reached.Load())

	// 7 MiB of a CacheBackend's annotation, declared and chunked.
	big := lmcacheBackend(nil, false)
	big.Annotations = map[string]string{"x": strings.Repeat("a", 7<<20)}
	body := reviewBody(t, big)
	for _, declared := range []bool{true, false} {
		c := &countingReader{r: bytes.NewReader(body)}
		req := httptest.NewRequest(http.MethodPost, Path, c)
		req.Header.Set("Content-Type", "application/json")
		req.ContentLength = -1
		if declared {
			req.ContentLength = int64(len(body))
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		assert.Equal(t, http.StatusRequestEntityTooLarge, rec.Code, "declared %v", declared)
		assert.EqualValues(t, 1, reached.Load(), "declared %v: never decoded", declared)
		assert.LessOrEqual(t, c.n.Load(), int64(MaxRequestBytes+1), "declared %v: read at most the limit", declared)
		if declared {
			assert.Zero(t, c.n.Load(), "a declared oversized body is not read at all")
		}
	}
}

// TestCacheBackendWebhookBoundsConcurrency: with MaxConcurrent requests
// being decided, another waits for a slot until its deadline and is
// refused busy, without reaching the decoder.
func TestCacheBackendWebhookBoundsConcurrency(t *testing.T) {
	var reached atomic.Int64
	block := make(chan struct{})
	h := served(t, &reached, block)
	body := reviewBody(t, lmcacheBackend(nil, false))
	var wg sync.WaitGroup
	for range MaxConcurrent {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body)))
		}()
	}
	require.Eventually(t, func() bool { return reached.Load() == MaxConcurrent }, 5*time.Second, time.Millisecond)
	rec, done := httptest.NewRecorder(), make(chan struct{})
	go func() {
		defer close(done)
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, Path+"?timeout=200ms", bytes.NewReader(body)))
	}()
	select {
	case <-done:
		assert.Equal(t, http.StatusServiceUnavailable, rec.Code)
		assert.Contains(t, rec.Body.String(), "busy")
	case <-time.After(5 * time.Second):
		t.Error("the extra request was not answered within 5 s of its 200 ms deadline")
	}
	assert.EqualValues(t, MaxConcurrent, reached.Load(), "the extra request never reached the decoder")
	close(block)
	wg.Wait()
	<-done
}
