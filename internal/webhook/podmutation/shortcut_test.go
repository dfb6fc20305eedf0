package podmutation

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
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
	"github.com/inferencecache/operator/internal/receipt"
)

// shortcutHandler serves namespace llm with one CacheBackend selecting
// app=qwen.
func shortcutHandler(t testing.TB) *Handler {
	x := NewIndex()
	cb := backend("cache")
	x.OnAdd(&cb, true)
	x.SetSynced(func() bool { return true })
	return &Handler{Backends: x}
}

// full serves body the whole way, through controller-runtime, as the
// manager does without the shortcut.
func full(h *Handler, body []byte) (int, []byte) {
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

// TestShortcutAnswersAsTheFullPath: the shortcut answers every pod CREATE
// it reads with certainty (a pod no CacheBackend claims from the bytes
// alone, any other one through Handle's code) with the full path's very
// bytes; everything else goes the full way.
func TestShortcutAnswersAsTheFullPath(t *testing.T) {
	v1 := "admission.k8s.io/v1"
	withRequest := func(extra string) string { return podCreate + "," + extra }
	cases := []struct {
		name    string
		body    []byte
		want    bool
		patched bool // the answer carries a patch
	}{
		{"unmatched pod", reviewJSON(v1, podCreate, podJSON(t, unmatched)), true, false},
		{"unmatched pod, v1beta1 review", reviewJSON("admission.k8s.io/v1beta1", podCreate, podJSON(t, unmatched)), true, false},
		{"unmatched pod, dry run", reviewJSON(v1, strings.Replace(podCreate, `"dryRun":false`, `"dryRun":true`, 1), podJSON(t, unmatched)), true, false},
		{"pod without labels", reviewJSON(v1, podCreate, podJSON(t, func(p *corev1.Pod) { p.Labels = nil })), true, false},
		{"pod with null metadata", reviewJSON(v1, podCreate, `{"metadata":null,"spec":{"containers":[]}}`), true, false},
		{"label with escapes and a null value", reviewJSON(v1, podCreate, `{"metadata":{"labels":{"\u0061pp":"qwen\u00e9","tier":null}},"spec":{}}`), true, false},
		{"uid needing HTML escapes", reviewJSON(v1, strings.Replace(podCreate, `"uid":"5f1d"`, `"uid":"<a&b>"`, 1), podJSON(t, unmatched)), true, false},
		{"other namespace", reviewJSON(v1, strings.Replace(podCreate, `"namespace":"llm"`, `"namespace":"web"`, 1), podJSON(t)), true, false},
		{"empty and nested arrays", reviewJSON(v1, podCreate, `{"metadata":{"labels":{}},"spec":{"a":[],"b":[[1,-2.5e3],{"c":[true,false,null]}]}}`), true, false},
		{"every request field, nulls among them", reviewJSON(v1, `"uid":"5f1d","kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},"namespace":"llm","operation":"CREATE","name":"p","subResource":null,"requestSubResource":"","requestKind":null,"requestResource":{"group":null,"version":"v1","resource":"pods","x":1},"userInfo":{"username":null,"uid":"u","groups":null,"extra":{"a":["b",null],"c":null}},"dryRun":null`, podJSON(t, unmatched)), true, false},

		{"matched pod", reviewJSON(v1, podCreate, podJSON(t)), true, true},
		{"matched pod, v1beta1 review", reviewJSON("admission.k8s.io/v1beta1", podCreate, podJSON(t)), true, true},
		{"matched pod, dry run", reviewJSON(v1, strings.Replace(podCreate, `"dryRun":false`, `"dryRun":true`, 1), podJSON(t)), true, true},
		{"matched pod without dryRun", reviewJSON(v1, strings.Replace(podCreate, `,"dryRun":false`, ``, 1), podJSON(t)), true, true},
		{"matched pod, named in the request", reviewJSON(v1, withRequest(`"name":"qwen-0"`), podJSON(t, func(p *corev1.Pod) { p.Name = "qwen-0" })), true, true},
		{"matched pod, label key escaped", reviewJSON(v1, podCreate, `{"metadata":{"labels":{"\u0061pp":"qwen"}},"spec":{"containers":[{"name":"vllm","image":"vllm"}]}}`), true, true},
		{"matched pod, skip-inject", reviewJSON(v1, podCreate, podJSON(t, func(p *corev1.Pod) { p.Annotations = map[string]string{v1alpha1.AnnotationSkipInject: "true"} })), true, true},
		{"matched pod without containers", reviewJSON(v1, podCreate, `{"metadata":{"labels":{"app":"qwen"}},"spec":{}}`), true, false},
		{"matched pod, null container", reviewJSON(v1, podCreate, `{"metadata":{"labels":{"app":"qwen"}},"spec":{"containers":[null]}}`), true, false},
		{"matched pod, container of the wrong type", reviewJSON(v1, podCreate, `{"metadata":{"labels":{"app":"qwen"}},"spec":{"containers":[{"name":1}]}}`), true, false},
		{"unmatched pod with a forged receipt", reviewJSON(v1, podCreate, podJSON(t, unmatched, func(p *corev1.Pod) {
			p.Annotations = map[string]string{receipt.AnnotationSignature: "forged"}
		})), true, true},
		{"unmatched pod with an injected-by annotation", reviewJSON(v1, podCreate, podJSON(t, unmatched, func(p *corev1.Pod) {
			p.Annotations = map[string]string{v1alpha1.AnnotationInjectedBy: "x"}
		})), true, true},

		{"update", reviewJSON(v1, strings.Replace(podCreate, `"CREATE"`, `"UPDATE"`, 1), podJSON(t, unmatched)), false, false},
		{"not a pod", reviewJSON(v1, strings.Replace(podCreate, `"kind":"Pod"}`, `"kind":"Service"}`, 1), `{"metadata":{}}`), false, false},
		{"no namespace", reviewJSON(v1, strings.Replace(podCreate, `"namespace":"llm",`, ``, 1), podJSON(t, unmatched)), false, false},
		{"null object", reviewJSON(v1, podCreate, `null`), false, false},
		{"labels not strings", reviewJSON(v1, podCreate, `{"metadata":{"labels":{"app":1}}}`), false, false},
		{"duplicate namespace", reviewJSON(v1, podCreate+`,"namespace":"web"`, podJSON(t, unmatched)), false, false},
		{"case-variant key at the top", []byte(strings.Replace(string(reviewJSON(v1, podCreate, podJSON(t, unmatched))), `"apiVersion":`, `"APIVersion":"x","apiVersion":`, 1)), false, false},
		{"case-variant labels", reviewJSON(v1, podCreate, `{"metadata":{"Labels":{"app":"qwen"}}}`), false, false},
		{"case-variant request field", reviewJSON(v1, withRequest(`"UserInfo":{}`), podJSON(t)), false, false},
		{"unknown review version", reviewJSON("admission.k8s.io/v2", podCreate, podJSON(t, unmatched)), false, false},
		{"a response in the request", []byte(strings.Replace(string(reviewJSON(v1, podCreate, podJSON(t))), `{"kind"`, `{"response":null,"kind"`, 1)), false, false},
		{"userInfo of the wrong type", reviewJSON(v1, strings.Replace(podCreate, `"userInfo":{`, `"userInfo":"me","x":{`, 1), podJSON(t)), false, false},
		{"groups of the wrong type", reviewJSON(v1, strings.Replace(podCreate, `"groups":[`, `"groups":[1,`, 1), podJSON(t)), false, false},
		{"extra of the wrong type", reviewJSON(v1, strings.Replace(podCreate, `"groups":`, `"extra":{"a":"b"},"groups":`, 1), podJSON(t)), false, false},
		{"duplicate userInfo", reviewJSON(v1, withRequest(`"userInfo":{}`), podJSON(t)), false, false},
		{"resource of the wrong type", reviewJSON(v1, withRequest(`"requestResource":{"group":false}`), podJSON(t)), false, false},
		{"subResource of the wrong type", reviewJSON(v1, withRequest(`"subResource":{}`), podJSON(t)), false, false},
		{"name of the wrong type", reviewJSON(v1, withRequest(`"name":7`), podJSON(t)), false, false},
		{"trailing garbage", append(reviewJSON(v1, podCreate, podJSON(t, unmatched)), '}'), false, false},
		{"truncated", reviewJSON(v1, podCreate, podJSON(t, unmatched))[:200], false, false},
		{"trailing comma in an array", reviewJSON(v1, podCreate, `{"metadata":{},"spec":{"a":[1,]}}`), false, false},
		{"trailing comma in an object", reviewJSON(v1, podCreate, `{"metadata":{},"spec":{"a":1,}}`), false, false},
		{"bad number", reviewJSON(v1, podCreate, `{"metadata":{},"spec":{"priority":01}}`), false, false},
		{"control character in a string", reviewJSON(v1, podCreate, "{\"metadata\":{\"name\":\"a\tb\"}}"), false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := shortcutHandler(t)
			got, ok := h.Shortcut(context.Background(), c.body)
			require.Equal(t, c.want, ok)
			if !ok {
				return
			}
			code, want := full(h, c.body)
			require.Equal(t, http.StatusOK, code)
			assert.Equal(t, string(want), string(got), "the shortcut writes the full path's response")
			assert.Equal(t, c.patched, strings.Contains(string(got), `"patch":`), "patched: %s", got)
		})
	}
}

// TestShortcutCountsTheDecision: a shortcut answer counts as the full
// path counts it (an inject.NoMatch decision, dry runs apart).
func TestShortcutCountsTheDecision(t *testing.T) {
	h := shortcutHandler(t)
	c := Decisions.WithLabelValues(string(inject.NoMatch), "")
	before := testutil.ToFloat64(c)
	_, ok := h.Shortcut(context.Background(), reviewJSON("admission.k8s.io/v1", podCreate, podJSON(t, unmatched)))
	require.True(t, ok)
	assert.Equal(t, before+1, testutil.ToFloat64(c))
	_, ok = h.Shortcut(context.Background(), reviewJSON("admission.k8s.io/v1", strings.Replace(podCreate, `"dryRun":false`, `"dryRun":true`, 1), podJSON(t, unmatched)))
	require.True(t, ok)
	assert.Equal(t, before+1, testutil.ToFloat64(c), "a dry run is not counted")
}

// TestShortcutNeedsASyncedIndex: before the index has listed the
// CacheBackends, every request goes the full way.
func TestShortcutNeedsASyncedIndex(t *testing.T) {
	h := shortcutHandler(t)
	h.Backends.SetSynced(func() bool { return false })
	_, ok := h.Shortcut(context.Background(), reviewJSON("admission.k8s.io/v1", podCreate, podJSON(t, unmatched)))
	assert.False(t, ok)
	_, ok = (&Handler{}).Shortcut(context.Background(), reviewJSON("admission.k8s.io/v1", podCreate, podJSON(t, unmatched)))
	assert.False(t, ok)
}

// TestGuardUsesTheShortcut: the guard writes the shortcut's answer without
// calling the full handler, and only for application/json requests.
func TestGuardUsesTheShortcut(t *testing.T) {
	h := shortcutHandler(t)
	var decoded int
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { decoded++; w.WriteHeader(299) })
	g := Guard(next, inject.Limits{}, h)
	body := reviewJSON("admission.k8s.io/v1", podCreate, podJSON(t, unmatched))
	for _, ct := range []string{"application/json", "text/plain"} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, MutatePath, bytes.NewReader(body))
		req.Header.Set("Content-Type", ct)
		g.ServeHTTP(rec, req)
		if ct == "application/json" {
			assert.Equal(t, http.StatusOK, rec.Code)
			assert.Contains(t, rec.Body.String(), `"allowed":true`)
			assert.Zero(t, decoded)
		} else {
			assert.Equal(t, 299, rec.Code, "controller-runtime answers other content types")
			assert.Equal(t, 1, decoded)
		}
	}
}

// FuzzShortcut: whenever the shortcut answers, the full path answers the
// same bytes.
func FuzzShortcut(f *testing.F) {
	v1 := "admission.k8s.io/v1"
	f.Add(reviewJSON(v1, podCreate, podJSON(f, unmatched)))
	f.Add(reviewJSON(v1, podCreate, podJSON(f)))
	f.Add(reviewJSON("admission.k8s.io/v1beta1", podCreate, `{"metadata":{"labels":{"\u0061pp":"qwen","x":null},"annotations":{"a":"b"}}}`))
	f.Add(reviewJSON(v1, podCreate, podJSON(f, unmatched, func(p *corev1.Pod) { p.Annotations = map[string]string{v1alpha1.AnnotationInjectSkipped: "x"} })))
	f.Add(reviewJSON(v1, podCreate+`,"name":"n","subResource":"","requestSubResource":null,"requestResource":{"group":"","version":"v1","resource":"pods"}`, `{"metadata":{"labels":{"app":"qwen"}},"spec":{"containers":[{"name":"vllm","args":["--port","8000"],"env":[{"name":"A","value":"b"}]}]}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		h := shortcutHandler(t)
		got, ok := h.Shortcut(context.Background(), body)
		if !ok {
			return
		}
		code, want := full(h, body)
		if code != http.StatusOK || !bytes.Equal(got, want) {
			t.Fatalf("the shortcut answered %s; the full path %d %s", got, code, want)
		}
	})
}

// TestGuardReusesRequestBuffersSafely: the guard reads every request into
// a pooled buffer and hands it back once the request is answered; answers
// to concurrent requests, shortcut and full path alike, each carry their
// own request's UID and decision (run with -race to see any read of a
// buffer after it went back to the pool).
func TestGuardReusesRequestBuffersSafely(t *testing.T) {
	h := shortcutHandler(t)
	g := Guard(&webhook.Admission{Handler: h}, inject.Limits{MaxConcurrent: 4}, h)
	bodies := map[bool]string{true: podJSON(t), false: podJSON(t, unmatched)}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := range 40 {
				wired := (w+i)%2 == 0
				uid := fmt.Sprintf("uid-%d-%d", w, i)
				req := strings.Replace(podCreate, `"uid":"5f1d"`, `"uid":"`+uid+`"`, 1)
				if i%5 == 0 { // a case-variant key: served the full way
					req += `,"Options":null`
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
				if string(out.Response.UID) != uid || (len(out.Response.Patch) > 0) != wired {
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
