package podmutation

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/receipt"
)

func TestHandlerRejectsAnEmptyNamespace(t *testing.T) {
	cb := backend("cache")
	req := request(t, admissionv1.Create, enginePod())
	req.Namespace = ""
	resp := (&Handler{Reader: fakeReader(t, &cb)}).Handle(context.Background(), req)
	assert.False(t, resp.Allowed)
	assert.Empty(t, resp.Patches)
}

// TestDryRunCreatesNothing: a dry-run admission never creates the receipt
// key Secret (or anything else).
func TestDryRunCreatesNothing(t *testing.T) {
	cb := backend("cache")
	var writes atomic.Int32
	scheme := runtime.NewScheme()
	require.NoError(t, v1alpha1.AddToScheme(scheme))
	require.NoError(t, corev1.AddToScheme(scheme))
	c := interceptor.NewClient(fake.NewClientBuilder().WithScheme(scheme).WithObjects(&cb).Build(), interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.CreateOption) error {
			writes.Add(1)
			return c.Create(ctx, o, opts...)
		},
	})
	keys := &receipt.KeyRing{Client: c, Reader: c, Namespace: "inferencecache-system", Name: receipt.DefaultSecretName}
	h := &Handler{Reader: c, Keys: keys}
	req := request(t, admissionv1.Create, enginePod())
	req.DryRun = ptr.To(true)
	resp := h.Handle(context.Background(), req)
	require.True(t, resp.Allowed)
	assert.NotEmpty(t, resp.Patches, "a dry run shows the wiring")
	assert.Zero(t, writes.Load(), "a dry run writes nothing")

	req.DryRun = nil
	h.Handle(context.Background(), req)
	assert.EqualValues(t, 1, writes.Load(), "a real admission creates the key Secret on first use")
}

// post is the API server's POST of an AdmissionReview to the webhook.
func post(target string, body []byte) *http.Request {
	r := httptest.NewRequest(http.MethodPost, target, bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	return r
}

func reviewOf(uid string, pod []byte) []byte {
	return fmt.Appendf(nil, `{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":%q,"kind":{"group":"","version":"v1","kind":"Pod"},"operation":"CREATE","namespace":"llm","object":%s}}`, uid, pod)
}

func TestGuardFailsOpenAboveTheSizeLimit(t *testing.T) {
	var decoded atomic.Int32
	next := ReviewFunc(func(context.Context, []byte) ([]byte, error) { decoded.Add(1); return []byte("decoded"), nil })
	g := Guard(next, inject.Limits{MaxRequestBytes: 64 << 10})
	big := enginePod(func(p *corev1.Pod) {
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "BIG", Value: strings.Repeat("x", 1<<20)}}
	})
	raw, err := json.Marshal(big)
	require.NoError(t, err)
	for _, chunked := range []bool{false, true} {
		req := post(MutatePath+"?timeout=5s", reviewOf("uid-1", raw))
		if chunked {
			req.ContentLength = -1
		}
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, req)
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		var out admissionv1.AdmissionReview
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out))
		assert.Equal(t, "uid-1", string(out.Response.UID))
		assert.True(t, out.Response.Allowed)
		assert.Nil(t, out.Response.Patch)
		assert.NotEmpty(t, out.Response.Warnings)
	}
	assert.Zero(t, decoded.Load(), "an oversized request is never decoded")

	small, _ := json.Marshal(enginePod())
	rec := httptest.NewRecorder()
	g.ServeHTTP(rec, post(MutatePath, reviewOf("uid-2", small)))
	assert.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, "decoded", rec.Body.String())
	assert.EqualValues(t, 1, decoded.Load())
}

// TestGuardLimitsConcurrency: no more than MaxConcurrent admissions are
// decoded at once; one that finds no slot before its deadline fails open.
func TestGuardLimitsConcurrency(t *testing.T) {
	release := make(chan struct{})
	var inFlight, peak atomic.Int32
	next := ReviewFunc(func(context.Context, []byte) ([]byte, error) {
		n := inFlight.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		<-release
		inFlight.Add(-1)
		return []byte("{}"), nil
	})
	g := Guard(next, inject.Limits{MaxConcurrent: 2})
	raw, _ := json.Marshal(enginePod())
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			g.ServeHTTP(httptest.NewRecorder(), post(MutatePath, reviewOf(fmt.Sprint(i), raw)))
		})
	}
	for inFlight.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the API server's deadline has passed
	rec := httptest.NewRecorder()
	g.ServeHTTP(rec, post(MutatePath, reviewOf("late", raw)).WithContext(ctx))
	var out admissionv1.AdmissionReview
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out))
	assert.True(t, out.Response.Allowed)
	assert.Equal(t, "late", string(out.Response.UID))
	close(release)
	wg.Wait()
	assert.EqualValues(t, 2, peak.Load())
}

// TestSlowClientsHoldNoSlot: clients that announce a body and never send
// it (issue 25: eight of them held every slot, so that every pod CREATE
// waited its whole deadline and was admitted unwired) hold only their own
// connections: with more of them than slots, another admission is still
// decided, and each slow one is answered 400 once its own deadline passes.
func TestSlowClientsHoldNoSlot(t *testing.T) {
	var entered atomic.Int32
	g := Guard(indexedHandler(t), inject.Limits{MaxConcurrent: 2})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered.Add(1)
		g.ServeHTTP(w, r)
	}))
	defer srv.Close()

	const slow = 4 // twice the slots
	conns := make([]net.Conn, slow)
	for i := range conns {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		require.NoError(t, err)
		defer c.Close()
		timeout := "30s"
		if i == 0 {
			timeout = "1s"
		}
		_, err = fmt.Fprintf(c, "POST %s?timeout=%s HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n{\"kind\":", MutatePath, timeout)
		require.NoError(t, err)
		conns[i] = c
	}
	for entered.Load() < slow {
		time.Sleep(time.Millisecond)
	}

	busy := testutil.ToFloat64(GuardTrips.WithLabelValues("busy"))
	body := reviewJSON("admission.k8s.io/v1", podCreate, podJSON(t))
	resp, err := http.Post(srv.URL+MutatePath+"?timeout=2s", "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	out, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", out)
	assert.Contains(t, string(out), `"patch":`, "the admission was decided, not failed open: %s", out)
	assert.Equal(t, busy, testutil.ToFloat64(GuardTrips.WithLabelValues("busy")), "no admission waited for a slot")

	// The slow client with a 1 s deadline is answered once it passes (the
	// client's own read deadline only keeps a broken guard from hanging
	// the test).
	require.NoError(t, conns[0].SetReadDeadline(time.Now().Add(20*time.Second)))
	line, err := bufio.NewReader(conns[0]).ReadString('\n')
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(line, "HTTP/1.1 400"), "%q", line)
}

// TestFailingOpenStillStripsAForgedReceipt: a pod admitted unwired because
// the webhook failed (here: the CacheBackends cannot be listed; likewise a
// cancelled request, a failed decision or a panic) still loses the receipt
// annotations a user pre-set (issue 25: fail-open paths kept them, so the
// pod carried a receipt it was never given), and nothing else changes.
func TestFailingOpenStillStripsAForgedReceipt(t *testing.T) {
	h := &Handler{Reader: failingReader(t)}
	resp := h.Handle(context.Background(), request(t, admissionv1.Create, enginePod(forgedReceipt)))
	require.True(t, resp.Allowed)
	require.Len(t, resp.Warnings, 1)
	assert.Contains(t, resp.Warnings[0], "pod admitted without cache wiring")
	require.NotEmpty(t, resp.Patches, "the forged receipt is removed")
	for _, op := range resp.Patches {
		assert.Equal(t, "remove", op.Operation, "%+v", op)
		assert.True(t, strings.HasPrefix(op.Path, "/metadata/annotations/inferencecache.io~1"), op.Path)
	}

	// A pod without such annotations is admitted without a patch.
	resp = h.Handle(context.Background(), request(t, admissionv1.Create, enginePod()))
	assert.True(t, resp.Allowed)
	assert.Empty(t, resp.Patches)
}
