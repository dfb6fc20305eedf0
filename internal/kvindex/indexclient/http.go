// Package indexclient is the operator manager's side of the KV-block
// index (cmd/cache-index, internal/kvindex/server): the client of its HTTP
// API that reads a CacheBackend's participation (HTTP), and the Poller
// that re-reads observed backends between reconciles and wakes those whose
// participation changed.
package indexclient

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// HTTP reads GET /v1/backends/{ns}/{name}/participation of the index's
// HTTP API; the manager's CacheBackend reconciler reads the index with it
// (a controller.IndexReader).
type HTTP struct {
	// BaseURL is the index's HTTP address, e.g.
	// http://inferencecache-index.inferencecache-system.svc:9401.
	BaseURL string
	// TokenFile, when set, holds the bearer token sent to the index (a
	// projected ServiceAccount token of the index's audience), read on
	// every request so that a rotated token is used at once.
	TokenFile string
	// Client is the HTTP client (a 5 s timeout when nil).
	Client *http.Client
}

// maxParticipationBody bounds the summary read (32 pods of a few hundred bytes).
const maxParticipationBody = 1 << 20

// Participation returns the participation summary of the CacheBackend
// namespace/name (at most 32 pods listed).
func (h *HTTP) Participation(ctx context.Context, namespace, name string) (*pb.ParticipationSummary, error) {
	u := strings.TrimSuffix(h.BaseURL, "/") + "/v1/backends/" + url.PathEscape(namespace) + "/" + url.PathEscape(name) + "/participation?maxPods=32"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("building the participation request: %w", err)
	}
	if h.TokenFile != "" {
		tok, err := os.ReadFile(h.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("reading the index token: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	}
	c := h.Client
	if c == nil {
		c = &http.Client{Timeout: 5 * time.Second}
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading participation: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxParticipationBody))
	if err != nil {
		return nil, fmt.Errorf("reading participation: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("the index answered %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	var sum pb.ParticipationSummary
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(body, &sum); err != nil {
		return nil, fmt.Errorf("decoding participation: %w", err)
	}
	return &sum, nil
}
