package validation

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"time"
)

// The CacheBackend webhook's guard (issue 35): without one, 8 concurrent
// 7 MiB requests grew the manager's heap by 385 MiB, beyond its 256 MiB
// limit. As the pod webhook's guard (internal/webhook/podmutation/guard.go)
// does, it reads each request with a deadline and a size limit before the
// request takes one of few concurrency slots; unlike it, it fails closed
// (the webhook's failurePolicy is Fail): an oversized or unserved request
// is refused, never decoded.
const (
	// MaxRequestBytes bounds a CacheBackend admission request: an object
	// and its old version, each at most etcd's 1.5 MiB.
	MaxRequestBytes = 4 << 20
	// MaxConcurrent CacheBackend admissions are decoded at once; CacheBackend
	// writes are rare, and each decode holds a few times its request.
	MaxConcurrent = 2
	// maxReadTime bounds the reading of a request without a deadline of
	// its own (the API server's ?timeout= is at most 30 s).
	maxReadTime = 30 * time.Second
)

// Guard serves next within the size limit max and at most n requests at
// once (MaxRequestBytes and MaxConcurrent when not positive).
func Guard(next http.Handler, maxBytes int64, n int) http.Handler {
	if maxBytes <= 0 {
		maxBytes = MaxRequestBytes
	}
	if n <= 0 {
		n = MaxConcurrent
	}
	return &guard{next: next, max: maxBytes, slots: make(chan struct{}, n)}
}

type guard struct {
	next  http.Handler
	max   int64
	slots chan struct{}
}

func (g *guard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ctx := r.Context()
	if t, err := time.ParseDuration(r.URL.Query().Get("timeout")); err == nil && t > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t)
		defer cancel()
	}
	if r.ContentLength > g.max {
		http.Error(w, fmt.Sprintf("the CacheBackend admission request has %d bytes, above the webhook's limit of %d", r.ContentLength, g.max), http.StatusRequestEntityTooLarge)
		return
	}
	deadline, ok := ctx.Deadline()
	if !ok || deadline.Sub(start) > maxReadTime {
		deadline = start.Add(maxReadTime)
	}
	_ = http.NewResponseController(w).SetReadDeadline(deadline) // not every ResponseWriter has a connection
	body, err := io.ReadAll(io.LimitReader(r.Body, g.max+1))
	if err != nil {
		http.Error(w, "reading the admission request: "+err.Error(), http.StatusBadRequest)
		return
	}
	if int64(len(body)) > g.max {
		http.Error(w, fmt.Sprintf("the CacheBackend admission request exceeds the webhook's limit of %d bytes", g.max), http.StatusRequestEntityTooLarge)
		return
	}
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	select {
	case g.slots <- struct{}{}:
		defer func() { <-g.slots }()
	case <-ctx.Done():
		http.Error(w, "the CacheBackend webhook was busy until the request's deadline; try again", http.StatusServiceUnavailable)
		return
	}
	r = r.WithContext(ctx)
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	g.next.ServeHTTP(w, r)
}
