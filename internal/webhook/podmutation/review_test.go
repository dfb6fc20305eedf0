package podmutation

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
)

// indexedHandler serves namespace llm with one CacheBackend selecting
// app=qwen.
func indexedHandler(t testing.TB) *Handler {
	x := NewIndex()
	cb := backend("cache")
	x.OnAdd(&cb, true)
	x.SetSynced(func() bool { return true })
	return &Handler{Backends: x}
}

// reference serves body as controller-runtime's webhook.Admission does:
// its own decode of the AdmissionReview, then Handle.
func reference(h *Handler, body []byte) (int, []byte) {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, MutatePath, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	(&webhook.Admission{Handler: h}).ServeHTTP(rec, req)
	return rec.Code, rec.Body.Bytes()
}

func podJSON(t testing.TB, mut ...func(*corev1.Pod)) string {
	b, err := json.Marshal(enginePod(mut...))
	require.NoError(t, err)
	return string(b)
}

func unmatched(p *corev1.Pod) { p.Labels = map[string]string{"app": "other"} }

// reviewJSON is an AdmissionReview as the API server sends it, with the
// request's fields around object given as JSON.
func reviewJSON(apiVersion, request, object string) []byte {
	return fmt.Appendf(nil, `{"kind":"AdmissionReview","apiVersion":%q,"request":{%s,"object":%s,"oldObject":null,"options":{"kind":"CreateOptions","apiVersion":"meta.k8s.io/v1"}}}`,
		apiVersion, request, object)
}

const podCreate = `"uid":"5f1d","kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},"requestKind":{"group":"","version":"v1","kind":"Pod"},"namespace":"llm","operation":"CREATE","userInfo":{"username":"system:serviceaccount:kube-system:replicaset-controller","groups":["system:serviceaccounts"]},"dryRun":false`

// failOpenPrefix begins the warning of a pod admitted unwired because the
// request could not be read.
const failOpenPrefix = "inferencecache: pod admitted without cache wiring: "

// answer is how Review answered a request.
type answer int

const (
	// same: the very bytes controller-runtime's decode and Handle write.
	same answer = iota
	// failsOpen: allowed, no patch, the request's UID and a warning that
	// the request could not be read (where controller-runtime's reading
	// is more lenient, or fails open too with its own message).
	failsOpen
	// refused: an error, which the guard answers with 400.
	refused
)

// TestReviewAnswersAsControllerRuntime: the one reader answers every
// request the API server can send with the bytes controller-runtime's
// full decode and Handle write, and fails open (or refuses a body that is
// no admission request) where it reads more strictly.
func TestReviewAnswersAsControllerRuntime(t *testing.T) {
	v1 := "admission.k8s.io/v1"
	withRequest := func(extra string) string { return podCreate + "," + extra }
	cases := []struct {
		name    string
		body    []byte
		want    answer
		patched bool // the answer carries a patch
	}{
		{"unmatched pod", reviewJSON(v1, podCreate, podJSON(t, unmatched)), same, false},
		{"unmatched pod, v1beta1 review", reviewJSON("admission.k8s.io/v1beta1", podCreate, podJSON(t, unmatched)), same, false},
		{"unmatched pod, dry run", reviewJSON(v1, strings.Replace(podCreate, `"dryRun":false`, `"dryRun":true`, 1), podJSON(t, unmatched)), same, false},
		{"pod without labels", reviewJSON(v1, podCreate, podJSON(t, func(p *corev1.Pod) { p.Labels = nil })), same, false},
		{"pod with null metadata", reviewJSON(v1, podCreate, `{"metadata":null,"spec":{"containers":[]}}`), same, false},
		{"label with escapes and a null value", reviewJSON(v1, podCreate, `{"metadata":{"labels":{"\u0061pp":"qwen\u00e9","tier":null}},"spec":{}}`), same, false},
		{"uid needing HTML escapes", reviewJSON(v1, strings.Replace(podCreate, `"uid":"5f1d"`, `"uid":"<a&b>"`, 1), podJSON(t, unmatched)), same, false},
		{"other namespace", reviewJSON(v1, strings.Replace(podCreate, `"namespace":"llm"`, `"namespace":"web"`, 1), podJSON(t)), same, false},
		{"empty and nested arrays", reviewJSON(v1, podCreate, `{"metadata":{"labels":{}},"spec":{"a":[],"b":[[1,-2.5e3],{"c":[true,false,null]}]}}`), same, false},
		{"every request field, nulls among them", reviewJSON(v1, `"uid":"5f1d","kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},"namespace":"llm","operation":"CREATE","name":"p","subResource":null,"requestSubResource":"","requestKind":null,"requestResource":{"group":null,"version":"v1","resource":"pods","x":1},"userInfo":{"username":null,"uid":"u","groups":null,"extra":{"a":["b",null],"c":null}},"dryRun":null`, podJSON(t, unmatched)), same, false},
		{"update", reviewJSON(v1, strings.Replace(podCreate, `"CREATE"`, `"UPDATE"`, 1), podJSON(t, unmatched)), same, false},
		{"not a pod", reviewJSON(v1, strings.Replace(podCreate, `"kind":"Pod"}`, `"kind":"Service"}`, 1), `{"metadata":{}}`), same, false},
		{"no namespace", reviewJSON(v1, strings.Replace(podCreate, `"namespace":"llm",`, ``, 1), podJSON(t, unmatched)), same, false},
		{"a response in the request", []byte(strings.Replace(string(reviewJSON(v1, podCreate, podJSON(t))), `{"kind"`, `{"response":null,"kind"`, 1)), same, true},

		{"matched pod", reviewJSON(v1, podCreate, podJSON(t)), same, true},
		{"matched pod, v1beta1 review", reviewJSON("admission.k8s.io/v1beta1", podCreate, podJSON(t)), same, true},
		{"matched pod, dry run", reviewJSON(v1, strings.Replace(podCreate, `"dryRun":false`, `"dryRun":true`, 1), podJSON(t)), same, true},
		{"matched pod without dryRun", reviewJSON(v1, strings.Replace(podCreate, `,"dryRun":false`, ``, 1), podJSON(t)), same, true},
		{"matched pod, named in the request", reviewJSON(v1, withRequest(`"name":"qwen-0"`), podJSON(t, func(p *corev1.Pod) { p.Name = "qwen-0" })), same, true},
		{"matched pod, label key escaped", reviewJSON(v1, podCreate, `{"metadata":{"labels":{"\u0061pp":"qwen"}},"spec":{"containers":[{"name":"vllm","image":"vllm"}]}}`), same, true},
		{"matched pod, skip-inject", reviewJSON(v1, podCreate, podJSON(t, func(p *corev1.Pod) { p.Annotations = map[string]string{v1alpha1.AnnotationSkipInject: "true"} })), same, true},
		{"matched pod without containers", reviewJSON(v1, podCreate, `{"metadata":{"labels":{"app":"qwen"}},"spec":{}}`), same, false},
		{"matched pod, null container", reviewJSON(v1, podCreate, `{"metadata":{"labels":{"app":"qwen"}},"spec":{"containers":[null]}}`), same, false},
		{"matched pod, container of the wrong type", reviewJSON(v1, podCreate, `{"metadata":{"labels":{"app":"qwen"}},"spec":{"containers":[{"name":1}]}}`), same, false},
		{"unmatched pod with a forged receipt", reviewJSON(v1, podCreate, podJSON(t, unmatched, func(p *corev1.Pod) {
			p.Annotations = map[string]string{v1alpha1.AnnotationReceiptSignature: "forged"}
		})), same, true},
		{"unmatched pod with an injected-by annotation", reviewJSON(v1, podCreate, podJSON(t, unmatched, func(p *corev1.Pod) {
			p.Annotations = map[string]string{v1alpha1.AnnotationInjectedBy: "x"}
		})), same, true},
		{"case-variant labels", reviewJSON(v1, podCreate, `{"metadata":{"Labels":{"app":"qwen"}}}`), same, false},
		{"case-variant request field", reviewJSON(v1, withRequest(`"UserInfo":{}`), podJSON(t)), same, true},

		{"null object", reviewJSON(v1, podCreate, `null`), failsOpen, false},
		{"labels not strings", reviewJSON(v1, podCreate, `{"metadata":{"labels":{"app":1}}}`), failsOpen, false},
		{"duplicate name in the pod", reviewJSON(v1, podCreate, `{"":1,"":2}`), failsOpen, false},
		{"duplicate namespace", reviewJSON(v1, podCreate+`,"namespace":"web"`, podJSON(t, unmatched)), failsOpen, false},
		{"duplicate userInfo", reviewJSON(v1, withRequest(`"userInfo":{}`), podJSON(t)), failsOpen, false},
		{"namespace of the wrong type", reviewJSON(v1, strings.Replace(podCreate, `"namespace":"llm"`, `"namespace":7`, 1), podJSON(t)), failsOpen, false},
		{"invalid UTF-8 in a label", reviewJSON(v1, podCreate, "{\"metadata\":{\"labels\":{\"app\":\"q\xffn\"}}}"), failsOpen, false},
		{"trailing comma in an object", reviewJSON(v1, podCreate, `{"metadata":{},"spec":{"a":1,}}`), failsOpen, false},
		{"bad number", reviewJSON(v1, podCreate, `{"metadata":{},"spec":{"priority":01}}`), failsOpen, false},
		{"control character in a string", reviewJSON(v1, podCreate, "{\"metadata\":{\"name\":\"a\tb\"}}"), failsOpen, false},
		{"truncated after the uid", reviewJSON(v1, podCreate, podJSON(t, unmatched))[:200], failsOpen, false},
		{"trailing garbage", append(reviewJSON(v1, podCreate, podJSON(t, unmatched)), '}'), failsOpen, false},

		{"unknown review version", reviewJSON("admission.k8s.io/v2", podCreate, podJSON(t, unmatched)), refused, false},
		{"truncated before the uid", reviewJSON(v1, podCreate, podJSON(t, unmatched))[:60], refused, false},
		{"no request", []byte(`{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1"}`), refused, false},
		{"no uid", reviewJSON(v1, strings.Replace(podCreate, `"uid":"5f1d",`, ``, 1), podJSON(t)), refused, false},
		{"not a review", []byte(strings.Replace(string(reviewJSON(v1, podCreate, podJSON(t))), `"kind":"AdmissionReview"`, `"kind":"Pod"`, 1)), refused, false},
		{"not JSON", []byte("uid: 5f1d"), refused, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := indexedHandler(t)
			got, err := h.Review(context.Background(), c.body)
			switch c.want {
			case refused:
				require.Error(t, err)
				return
			case same:
				require.NoError(t, err)
				code, want := reference(h, c.body)
				require.Equal(t, http.StatusOK, code)
				assert.Equal(t, string(want), string(got), "Review writes controller-runtime's response")
			case failsOpen:
				require.NoError(t, err)
				var out admissionv1.AdmissionReview
				require.NoError(t, json.Unmarshal(got, &out), "%s", got)
				require.NotNil(t, out.Response, "%s", got)
				assert.Equal(t, "5f1d", string(out.Response.UID))
				assert.True(t, out.Response.Allowed)
				require.Len(t, out.Response.Warnings, 1, "%s", got)
				assert.True(t, strings.HasPrefix(out.Response.Warnings[0], failOpenPrefix), "%s", got)
			}
			assert.Equal(t, c.patched, strings.Contains(string(got), `"patch":`), "patched: %s", got)
		})
	}
}

// TestReviewCountsTheDecision: an unmatched pod counts as an
// inject.NoMatch decision, dry runs apart.
func TestReviewCountsTheDecision(t *testing.T) {
	h := indexedHandler(t)
	c := Decisions.WithLabelValues(string(inject.NoMatch), "")
	before := testutil.ToFloat64(c)
	_, err := h.Review(context.Background(), reviewJSON("admission.k8s.io/v1", podCreate, podJSON(t, unmatched)))
	require.NoError(t, err)
	assert.Equal(t, before+1, testutil.ToFloat64(c))
	_, err = h.Review(context.Background(), reviewJSON("admission.k8s.io/v1", strings.Replace(podCreate, `"dryRun":false`, `"dryRun":true`, 1), podJSON(t, unmatched)))
	require.NoError(t, err)
	assert.Equal(t, before+1, testutil.ToFloat64(c), "a dry run is not counted")
}

// TestReviewWithoutASyncedIndex: before the index has listed the
// CacheBackends, Review lists them through the Reader and wires the pod
// all the same.
func TestReviewWithoutASyncedIndex(t *testing.T) {
	cb := backend("cache")
	h := indexedHandler(t)
	h.Backends.SetSynced(func() bool { return false })
	h.Reader = fakeReader(t, &cb)
	got, err := h.Review(context.Background(), reviewJSON("admission.k8s.io/v1", podCreate, podJSON(t)))
	require.NoError(t, err)
	assert.Contains(t, string(got), `"patch":`)
	code, want := reference(h, reviewJSON("admission.k8s.io/v1", podCreate, podJSON(t)))
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, string(want), string(got))
}

// TestGuardServesTheReviewer: the guard hands application/json requests to
// the Reviewer and writes its answer; other content types and the
// Reviewer's errors are answered 400.
func TestGuardServesTheReviewer(t *testing.T) {
	h := indexedHandler(t)
	g := Guard(h, inject.Limits{})
	body := reviewJSON("admission.k8s.io/v1", podCreate, podJSON(t, unmatched))
	for _, c := range []struct {
		ct   string
		body []byte
		code int
	}{
		{"application/json", body, http.StatusOK},
		{"text/plain", body, http.StatusBadRequest},
		{"application/json", []byte(`{}`), http.StatusBadRequest},
	} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, MutatePath, bytes.NewReader(c.body))
		req.Header.Set("Content-Type", c.ct)
		g.ServeHTTP(rec, req)
		assert.Equal(t, c.code, rec.Code, "%s %s: %s", c.ct, c.body, rec.Body.String())
		if c.code == http.StatusOK {
			assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
			assert.Contains(t, rec.Body.String(), `"allowed":true`)
		}
	}
}

// FuzzReview: Review never panics; whenever it answers a request with a
// decision (neither an error nor a fail-open warning) and controller-
// runtime's decode and Handle decide it too, the answers are the same
// bytes, forged-receipt stripping included. Where Review reads more
// strictly it fails open, with the request's UID.
func FuzzReview(f *testing.F) {
	v1 := "admission.k8s.io/v1"
	f.Add(reviewJSON(v1, podCreate, podJSON(f, unmatched)))
	f.Add(reviewJSON(v1, podCreate, podJSON(f)))
	f.Add(reviewJSON("admission.k8s.io/v1beta1", podCreate, `{"metadata":{"labels":{"\u0061pp":"qwen","x":null},"annotations":{"a":"b"}}}`))
	f.Add(reviewJSON(v1, podCreate, podJSON(f, unmatched, func(p *corev1.Pod) { p.Annotations = map[string]string{v1alpha1.AnnotationInjectSkipped: "x"} })))
	f.Add(reviewJSON(v1, podCreate, podJSON(f, unmatched, func(p *corev1.Pod) { p.Annotations = map[string]string{v1alpha1.AnnotationReceiptSignature: "forged"} })))
	f.Add(reviewJSON(v1, podCreate+`,"name":"n","subResource":"","requestSubResource":null,"requestResource":{"group":"","version":"v1","resource":"pods"}`, `{"metadata":{"labels":{"app":"qwen"}},"spec":{"containers":[{"name":"vllm","args":["--port","8000"],"env":[{"name":"A","value":"b"}]}]}}`))
	// What failed CI on the scanner: a duplicate name in the pod.
	f.Add(reviewJSON(v1, podCreate, `{"":1,"":2}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		h := indexedHandler(t)
		got, err := h.Review(context.Background(), body)
		if err != nil {
			return
		}
		var out admissionv1.AdmissionReview
		if err := json.Unmarshal(got, &out); err != nil || out.Response == nil || out.Response.UID == "" {
			t.Fatalf("Review answered %s (%v)", got, err)
		}
		if decided(out) {
			code, want := reference(h, body)
			var ref admissionv1.AdmissionReview
			if code == http.StatusOK && json.Unmarshal(want, &ref) == nil && decided(ref) && !bytes.Equal(got, want) {
				t.Fatalf("Review answered %s; controller-runtime %d %s", got, code, want)
			}
		}
	})
}

// decided reports whether an answer is a decision: for the request's UID
// (controller-runtime answers a request it cannot decode without one), with
// no fail-open warning.
func decided(r admissionv1.AdmissionReview) bool {
	return r.Response != nil && r.Response.UID != "" && !slices.ContainsFunc(r.Response.Warnings, func(w string) bool { return strings.HasPrefix(w, failOpenPrefix) })
}

// TestGuardReusesRequestBuffersSafely: the guard reads every request into
// a pooled buffer and hands it back once the request is answered; answers
// to concurrent requests, decided and failed open alike, each carry their
// own request's UID and decision (run with -race to see any read of a
// buffer after it went back to the pool).
func TestGuardReusesRequestBuffersSafely(t *testing.T) {
	h := indexedHandler(t)
	g := Guard(h, inject.Limits{MaxConcurrent: 4})
	bodies := map[bool]string{true: podJSON(t), false: podJSON(t, unmatched)}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := range 40 {
				wired := (w+i)%2 == 0
				uid := fmt.Sprintf("uid-%d-%d", w, i)
				req := strings.Replace(podCreate, `"uid":"5f1d"`, `"uid":"`+uid+`"`, 1)
				if i%5 == 0 { // a request Review fails open
					req += `,"namespace":"llm"`
				}
				rec := httptest.NewRecorder()
				r := httptest.NewRequest(http.MethodPost, MutatePath, bytes.NewReader(reviewJSON("admission.k8s.io/v1", req, bodies[wired])))
				r.Header.Set("Content-Type", "application/json")
				g.ServeHTTP(rec, r)
				var out admissionv1.AdmissionReview
				if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil {
					errs <- fmt.Errorf("%s: %w: %s", uid, err, rec.Body.String())
					return
				}
				if string(out.Response.UID) != uid || (len(out.Response.Patch) > 0) != (wired && i%5 != 0) {
					errs <- fmt.Errorf("request %s (wired %v) answered for %s with patch %s", uid, wired, out.Response.UID, out.Response.Patch)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
