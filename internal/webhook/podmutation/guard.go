package podmutation

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

const (
	// hardMaxRequestBytes caps what is read at all, even to find the UID
	// (the API server sends at most 3 MiB objects).
	hardMaxRequestBytes = 8 << 20
)

// GuardTrips counts admissions the guard failed open, by reason.
var GuardTrips = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "inferencecache_webhook_guard_trips_total",
	Help: "Pod admissions admitted unwired without being decoded, by reason (oversized: the request exceeded --webhook-max-request-bytes; busy: no slot of --webhook-max-concurrency freed before the request's deadline).",
}, []string{"reason"})

// AdmissionDuration is the time the pod webhook takes to answer, from the
// request's arrival at the guard to the response written, fail-open
// answers included. Its buckets resolve the tens of microseconds an
// admission takes (controller-runtime's own histogram jumps from 1 ms to
// 10 ms).
var AdmissionDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
	Name:    "inferencecache_webhook_admission_duration_seconds",
	Help:    "Time the pod injection webhook takes to answer an admission request, in seconds.",
	Buckets: admissionBuckets,
})

var admissionBuckets = []float64{50e-6, 100e-6, 200e-6, 300e-6, 500e-6, 750e-6,
	1e-3, 1.5e-3, 2e-3, 3e-3, 5e-3, 7.5e-3, 10e-3, 20e-3, 50e-3}

// AdmissionWait is the part of AdmissionDuration spent waiting for one of
// the --webhook-max-concurrency slots: high while the handling itself
// stays short means the limit, not the handler, holds admissions back.
var AdmissionWait = prometheus.NewHistogram(prometheus.HistogramOpts{
	Name:    "inferencecache_webhook_admission_wait_seconds",
	Help:    "Time pod admission requests waited for a concurrency slot of the pod injection webhook, in seconds.",
	Buckets: admissionBuckets,
})

func init() { metrics.Registry.MustRegister(GuardTrips, AdmissionDuration, AdmissionWait) }

// Served is the pod webhook as the manager serves it: h behind
// controller-runtime's admission webhook, behind the Guard, with h's
// Shortcut. The manager and the served-path benchmark both build it here.
func Served(h *Handler, l inject.Limits) http.Handler {
	return Guard(&webhook.Admission{Handler: h, LogConstructor: requestLogger}, l, h)
}

// requestLogger replaces controller-runtime's DefaultLogConstructor, which
// adds six request fields to a logger on every admission (some thirty
// allocations with zap, for lines that are mostly never written): the
// handler names the pod and the request's UID on the lines it writes.
func requestLogger(base logr.Logger, _ *admission.Request) logr.Logger { return base }

// Guard wraps the pod webhook's HTTP handler with the inject.Limits and the
// request's own deadline (the API server's ?timeout=).
//
// fast, when not nil, may answer a request from its bytes (see
// Handler.Shortcut) before next decodes it; it sees only requests within
// the limits and sent as application/json, as controller-runtime requires.
func Guard(next http.Handler, l inject.Limits, fast Shortcut) http.Handler {
	if l.MaxRequestBytes <= 0 {
		l.MaxRequestBytes = inject.DefaultMaxRequestBytes
	}
	if l.MaxConcurrent <= 0 {
		l.MaxConcurrent = inject.DefaultMaxConcurrent
	}
	return &guard{next: next, fast: fast, max: l.MaxRequestBytes, slots: make(chan struct{}, l.MaxConcurrent)}
}

type guard struct {
	next  http.Handler
	fast  Shortcut
	max   int64
	slots chan struct{}
}

func (g *guard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	defer func() { AdmissionDuration.Observe(time.Since(start).Seconds()) }()
	ctx := r.Context()
	if t, err := time.ParseDuration(r.URL.Query().Get("timeout")); err == nil && t > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t)
		defer cancel()
		r = r.WithContext(ctx)
	}
	body := http.MaxBytesReader(w, r.Body, hardMaxRequestBytes)
	if r.ContentLength > g.max {
		g.failOpen(ctx, w, body, "oversized", r.ContentLength)
		return
	}
	select {
	case g.slots <- struct{}{}:
		AdmissionWait.Observe(time.Since(start).Seconds())
		defer func() { <-g.slots }()
	case <-ctx.Done():
		g.failOpen(ctx, w, body, "busy", r.ContentLength)
		return
	}
	pooled := bodies.Get().(*[]byte)
	buf, err := readBody((*pooled)[:0], io.LimitReader(body, g.max+1), r.ContentLength)
	defer func() {
		// Nothing holds on to the request's bytes once it is answered: the
		// shortcut copies what it keeps, and the full path reads its own copy.
		if cap(buf) <= maxPooledBody {
			*pooled = buf[:0]
			bodies.Put(pooled)
		}
	}()
	if err != nil {
		http.Error(w, "reading the admission request: "+err.Error(), http.StatusBadRequest)
		return
	}
	if int64(len(buf)) > g.max {
		g.failOpen(ctx, w, io.MultiReader(bytes.NewReader(buf), body), "oversized", -1)
		return
	}
	if g.fast != nil && r.Header.Get("Content-Type") == "application/json" {
		if out, ok := g.fast.Shortcut(ctx, buf); ok {
			_, _ = w.Write(out)
			return
		}
	}
	r.Body = io.NopCloser(bytes.NewReader(buf))
	r.ContentLength = int64(len(buf))
	g.next.ServeHTTP(w, r)
}

// bodies holds the buffers admission requests are read into, so that a
// request does not allocate its few KiB again (and the garbage collector
// does not chase them) at every admission.
var bodies = sync.Pool{New: func() any { return new([]byte) }}

// maxPooledBody: a buffer grown past this by an unusual request is left to
// the garbage collector rather than kept.
const maxPooledBody = 64 << 10

// readBody appends r to buf, sized up front from the request's declared
// length when it has one.
func readBody(buf []byte, r io.Reader, length int64) ([]byte, error) {
	if length > 0 && int64(cap(buf)) < length+1 && length < hardMaxRequestBytes {
		buf = make([]byte, 0, length+1) // +1: the read that finds the end
	}
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// failOpen answers an AdmissionReview it did not decode: allowed, without
// a patch, with a warning. It reads the request only as far as its UID,
// which the API server writes before the object.
func (g *guard) failOpen(ctx context.Context, w http.ResponseWriter, body io.Reader, reason string, size int64) {
	uid, err := reviewUID(body)
	_, _ = io.Copy(io.Discard, body)
	if err != nil {
		http.Error(w, "reading the admission request: "+err.Error(), http.StatusBadRequest)
		return
	}
	GuardTrips.WithLabelValues(reason).Inc()
	Decisions.WithLabelValues(string(inject.FailOpen), "guard-"+reason).Inc()
	msg := "the admission request exceeds the webhook's size limit"
	if reason == "busy" {
		msg = "the webhook was busy until the request's deadline"
	}
	log.FromContext(ctx).WithName("pod-webhook").Info("pod admitted unwired without decoding it", "reason", reason, "uid", uid, "bytes", size, "limit", g.max)
	out := admissionv1.AdmissionReview{Response: &admissionv1.AdmissionResponse{
		UID: uid, Allowed: true, Warnings: []string{"inferencecache: pod admitted without cache wiring: " + msg},
	}}
	out.APIVersion, out.Kind = "admission.k8s.io/v1", "AdmissionReview"
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// reviewUID streams an AdmissionReview up to request.uid. Values before
// it are skipped token by token; the API server writes the UID first, so
// the object (the large part) is never decoded.
func reviewUID(r io.Reader) (types.UID, error) {
	dec := json.NewDecoder(bufio.NewReaderSize(r, 4096))
	if err := expectDelim(dec, '{'); err != nil {
		return "", err
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return "", err
		}
		if k != "request" {
			if err := skipValue(dec); err != nil {
				return "", err
			}
			continue
		}
		if err := expectDelim(dec, '{'); err != nil {
			return "", err
		}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return "", err
			}
			if k == "uid" {
				v, err := dec.Token()
				if s, ok := v.(string); err == nil && ok {
					return types.UID(s), nil
				}
				return "", errors.New("request.uid is not a string")
			}
			if err := skipValue(dec); err != nil {
				return "", err
			}
		}
		break
	}
	return "", errors.New("no request.uid in the admission review")
}

func expectDelim(dec *json.Decoder, d json.Delim) error {
	t, err := dec.Token()
	if err != nil {
		return err
	}
	if t != d {
		return fmt.Errorf("expected %v in the admission review, got %v", d, t)
	}
	return nil
}

func skipValue(dec *json.Decoder) error {
	depth := 0
	for {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		if d, ok := t.(json.Delim); ok {
			if d == '{' || d == '[' {
				depth++
			} else {
				depth--
			}
		}
		if depth == 0 {
			return nil
		}
	}
}
