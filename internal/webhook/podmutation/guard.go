package podmutation

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/inferencecache/operator/internal/inject"
	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

const (
	// hardMaxRequestBytes caps what is read at all, even to find the UID
	// (the API server sends at most 3 MiB objects).
	hardMaxRequestBytes = 8 << 20
	// maxReadTime bounds the reading of a request without a deadline of
	// its own (the API server's ?timeout= is at most 30 s).
	maxReadTime = 30 * time.Second
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

// Served is the pod webhook as the manager serves it: h's Review behind
// the Guard. The manager and the served-path benchmark both build it here.
func Served(h *Handler, l inject.Limits) http.Handler { return Guard(h, l) }

// Reviewer answers an AdmissionReview's bytes with the response's bytes,
// or an error for a body that is not an admission request (Handler.Review).
// It must not keep body, which the guard reuses once it has answered.
type Reviewer interface {
	Review(ctx context.Context, body []byte) ([]byte, error)
}

// ReviewFunc is a Reviewer.
type ReviewFunc func(ctx context.Context, body []byte) ([]byte, error)

// Review calls f.
func (f ReviewFunc) Review(ctx context.Context, body []byte) ([]byte, error) { return f(ctx, body) }

// Guard serves next over HTTP within the inject.Limits and the request's
// own deadline (the API server's ?timeout=). next sees only requests within
// the limits and sent as application/json, as the API server sends them.
func Guard(next Reviewer, l inject.Limits) http.Handler {
	if l.MaxRequestBytes <= 0 {
		l.MaxRequestBytes = inject.DefaultMaxRequestBytes
	}
	if l.MaxConcurrent <= 0 {
		l.MaxConcurrent = inject.DefaultMaxConcurrent
	}
	return &guard{next: next, max: l.MaxRequestBytes, slots: make(chan struct{}, l.MaxConcurrent)}
}

type guard struct {
	next  Reviewer
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
	// The body is read before a slot is taken, within the request's
	// deadline: a client that announces a body and sends it slowly (or
	// never) holds its own connection until then, never one of the slots
	// the other admissions wait for.
	deadline, ok := ctx.Deadline()
	if !ok || deadline.Sub(start) > maxReadTime {
		deadline = start.Add(maxReadTime)
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(deadline) // not every ResponseWriter has a connection
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		// The API server always sends JSON; the rest of the body is left
		// to the server, within the deadline.
		http.Error(w, fmt.Sprintf("the admission request's Content-Type is %q, not application/json", ct), http.StatusBadRequest)
		return
	}
	body := http.MaxBytesReader(w, r.Body, hardMaxRequestBytes)
	if r.ContentLength > g.max {
		g.failOpen(ctx, w, body, "oversized", r.ContentLength)
		return
	}
	pooled := bodies.Get().(*[]byte)
	buf, err := readBody((*pooled)[:0], io.LimitReader(body, g.max+1), r.ContentLength)
	defer func() {
		// Nothing holds on to the request's bytes once it is answered
		// (Reviewer's contract).
		if cap(buf) <= maxPooledBody {
			*pooled = buf[:0]
			bodies.Put(pooled)
		}
	}()
	if err != nil {
		// The deadline stays: the server's own reading of what remains of
		// the body ends with it, and the connection closes.
		http.Error(w, "reading the admission request: "+err.Error(), http.StatusBadRequest)
		return
	}
	if int64(len(buf)) > g.max {
		g.failOpen(ctx, w, io.MultiReader(bytes.NewReader(buf), body), "oversized", -1)
		return
	}
	// The whole body is read: the connection, which carries the next
	// request too, no longer needs this one's deadline.
	_ = rc.SetReadDeadline(time.Time{})
	waiting := time.Now()
	select {
	case g.slots <- struct{}{}:
		AdmissionWait.Observe(time.Since(waiting).Seconds())
		defer func() { <-g.slots }()
	case <-ctx.Done():
		g.failOpen(ctx, w, bytes.NewReader(buf), "busy", int64(len(buf)))
		return
	}
	out, err := g.next.Review(ctx, buf)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
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
