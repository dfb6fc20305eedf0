package inject

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

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

// TestShortcutAnswersAsTheFullPath: the shortcut answers only pods no
// CacheBackend claims that carry no receipt annotation, and answers them
// with the full path's very bytes; everything else goes the full way.
func TestShortcutAnswersAsTheFullPath(t *testing.T) {
	v1 := "admission.k8s.io/v1"
	cases := []struct {
		name string
		body []byte
		want bool
	}{
		{"unmatched pod", reviewJSON(v1, podCreate, podJSON(t, unmatched)), true},
		{"unmatched pod, v1beta1 review", reviewJSON("admission.k8s.io/v1beta1", podCreate, podJSON(t, unmatched)), true},
		{"unmatched pod, dry run", reviewJSON(v1, strings.Replace(podCreate, `"dryRun":false`, `"dryRun":true`, 1), podJSON(t, unmatched)), true},
		{"pod without labels", reviewJSON(v1, podCreate, podJSON(t, func(p *corev1.Pod) { p.Labels = nil })), true},
		{"pod with null metadata", reviewJSON(v1, podCreate, `{"metadata":null,"spec":{"containers":[]}}`), true},
		{"label with escapes and a null value", reviewJSON(v1, podCreate, `{"metadata":{"labels":{"\u0061pp":"qwen\u00e9","tier":null}},"spec":{}}`), true},
		{"uid needing HTML escapes", reviewJSON(v1, strings.Replace(podCreate, `"uid":"5f1d"`, `"uid":"<a&b>"`, 1), podJSON(t, unmatched)), true},
		{"other namespace", reviewJSON(v1, strings.Replace(podCreate, `"namespace":"llm"`, `"namespace":"web"`, 1), podJSON(t)), true},

		{"matched pod", reviewJSON(v1, podCreate, podJSON(t)), false},
		{"matched pod, label key escaped", reviewJSON(v1, podCreate, `{"metadata":{"labels":{"\u0061pp":"qwen"}},"spec":{}}`), false},
		{"unmatched pod with a forged receipt", reviewJSON(v1, podCreate, podJSON(t, unmatched, func(p *corev1.Pod) {
			p.Annotations = map[string]string{receipt.AnnotationSignature: "forged"}
		})), false},
		{"unmatched pod with an injected-by annotation", reviewJSON(v1, podCreate, podJSON(t, unmatched, func(p *corev1.Pod) {
			p.Annotations = map[string]string{AnnotationInjectedBy: "x"}
		})), false},
		{"update", reviewJSON(v1, strings.Replace(podCreate, `"CREATE"`, `"UPDATE"`, 1), podJSON(t, unmatched)), false},
		{"not a pod", reviewJSON(v1, strings.Replace(podCreate, `"kind":"Pod"}`, `"kind":"Service"}`, 1), `{"metadata":{}}`), false},
		{"no namespace", reviewJSON(v1, strings.Replace(podCreate, `"namespace":"llm",`, ``, 1), podJSON(t, unmatched)), false},
		{"null object", reviewJSON(v1, podCreate, `null`), false},
		{"labels not strings", reviewJSON(v1, podCreate, `{"metadata":{"labels":{"app":1}}}`), false},
		{"duplicate namespace", reviewJSON(v1, podCreate+`,"namespace":"web"`, podJSON(t, unmatched)), false},
		{"case-variant key at the top", []byte(strings.Replace(string(reviewJSON(v1, podCreate, podJSON(t, unmatched))), `"apiVersion":`, `"APIVersion":"x","apiVersion":`, 1)), false},
		{"case-variant labels", reviewJSON(v1, podCreate, `{"metadata":{"Labels":{"app":"qwen"}}}`), false},
		{"unknown review version", reviewJSON("admission.k8s.io/v2", podCreate, podJSON(t, unmatched)), false},
		{"trailing garbage", append(reviewJSON(v1, podCreate, podJSON(t, unmatched)), '}'), false},
		{"truncated", reviewJSON(v1, podCreate, podJSON(t, unmatched))[:200], false},
		{"empty and nested arrays", reviewJSON(v1, podCreate, `{"metadata":{"labels":{}},"spec":{"a":[],"b":[[1,-2.5e3],{"c":[true,false,null]}]}}`), true},
		{"trailing comma in an array", reviewJSON(v1, podCreate, `{"metadata":{},"spec":{"a":[1,]}}`), false},
		{"trailing comma in an object", reviewJSON(v1, podCreate, `{"metadata":{},"spec":{"a":1,}}`), false},
		{"bad number", reviewJSON(v1, podCreate, `{"metadata":{},"spec":{"priority":01}}`), false},
		{"control character in a string", reviewJSON(v1, podCreate, "{\"metadata\":{\"name\":\"a\tb\"}}"), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := shortcutHandler(t)
			got, ok := h.Shortcut(c.body)
			require.Equal(t, c.want, ok)
			if !ok {
				return
			}
			code, want := full(h, c.body)
			require.Equal(t, http.StatusOK, code)
			assert.Equal(t, string(want), string(got), "the shortcut writes the full path's response")
		})
	}
}

// TestShortcutCountsTheDecision: a shortcut answer counts as the full
// path counts it (a NoMatch decision, dry runs apart).
func TestShortcutCountsTheDecision(t *testing.T) {
	h := shortcutHandler(t)
	c := Decisions.WithLabelValues(string(NoMatch), "")
	before := testutil.ToFloat64(c)
	_, ok := h.Shortcut(reviewJSON("admission.k8s.io/v1", podCreate, podJSON(t, unmatched)))
	require.True(t, ok)
	assert.Equal(t, before+1, testutil.ToFloat64(c))
	_, ok = h.Shortcut(reviewJSON("admission.k8s.io/v1", strings.Replace(podCreate, `"dryRun":false`, `"dryRun":true`, 1), podJSON(t, unmatched)))
	require.True(t, ok)
	assert.Equal(t, before+1, testutil.ToFloat64(c), "a dry run is not counted")
}

// TestShortcutNeedsASyncedIndex: before the index has listed the
// CacheBackends, every request goes the full way.
func TestShortcutNeedsASyncedIndex(t *testing.T) {
	h := shortcutHandler(t)
	h.Backends.SetSynced(func() bool { return false })
	_, ok := h.Shortcut(reviewJSON("admission.k8s.io/v1", podCreate, podJSON(t, unmatched)))
	assert.False(t, ok)
	_, ok = (&Handler{}).Shortcut(reviewJSON("admission.k8s.io/v1", podCreate, podJSON(t, unmatched)))
	assert.False(t, ok)
}

// TestGuardUsesTheShortcut: the guard writes the shortcut's answer without
// calling the full handler, and only for application/json requests.
func TestGuardUsesTheShortcut(t *testing.T) {
	h := shortcutHandler(t)
	var decoded int
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { decoded++; w.WriteHeader(299) })
	g := Guard(next, Limits{}, h)
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
// same bytes, or refuses the review as undecodable (a field the shortcut
// does not read has a type no API server sends; the API server then
// admits the pod unchanged under the webhook's failurePolicy Ignore,
// which is the shortcut's answer too).
func FuzzShortcut(f *testing.F) {
	v1 := "admission.k8s.io/v1"
	f.Add(reviewJSON(v1, podCreate, podJSON(f, unmatched)))
	f.Add(reviewJSON(v1, podCreate, podJSON(f)))
	f.Add(reviewJSON("admission.k8s.io/v1beta1", podCreate, `{"metadata":{"labels":{"\u0061pp":"qwen","x":null},"annotations":{"a":"b"}}}`))
	f.Add(reviewJSON(v1, podCreate, podJSON(f, unmatched, func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationSkipped: "x"} })))
	f.Fuzz(func(t *testing.T, body []byte) {
		h := shortcutHandler(t)
		got, ok := h.Shortcut(body)
		if !ok {
			return
		}
		code, want := full(h, body)
		if code == http.StatusOK && bytes.Equal(got, want) {
			return
		}
		var out struct {
			Response struct {
				Allowed bool `json:"allowed"`
				Status  struct {
					Code int `json:"code"`
				} `json:"status"`
			} `json:"response"`
		}
		require.NoError(t, json.Unmarshal(want, &out), "the full path's answer: %s", want)
		if out.Response.Allowed || out.Response.Status.Code != http.StatusBadRequest {
			t.Fatalf("the shortcut answered %s; the full path %s", got, want)
		}
	})
}
