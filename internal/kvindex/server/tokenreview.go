package server

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inferencecache/operator/internal/kvindex"
)

// TokenReviewer is the part of the Kubernetes API the TokenReview
// authenticator needs: AuthenticationV1().TokenReviews() satisfies it, and
// unit tests use a fake.
type TokenReviewer interface {
	Create(ctx context.Context, tr *authnv1.TokenReview, opts metav1.CreateOptions) (*authnv1.TokenReview, error)
}

// TokenReviewAuthenticator checks tokens with the API server's TokenReview
// (authentication.k8s.io/v1) for the index's audience, and caches each
// verdict for CacheTTL so that a router calling Score per request costs one
// review per token and minute, not one per call.
type TokenReviewAuthenticator struct {
	Reviewer  TokenReviewer
	Audiences []string
	CacheTTL  time.Duration
	Now       func() time.Time

	mu    sync.Mutex
	cache map[[32]byte]cachedReview
}

type cachedReview struct {
	caller  kvindex.Caller
	err     error
	expires time.Time
}

const maxCachedReviews = 4096

// Authenticate implements kvindex.Authenticator.
func (a *TokenReviewAuthenticator) Authenticate(ctx context.Context, token string) (kvindex.Caller, error) {
	if token == "" {
		return kvindex.Caller{}, fmt.Errorf("no bearer token: %w", kvindex.ErrUnauthenticated)
	}
	now := time.Now
	if a.Now != nil {
		now = a.Now
	}
	key := sha256.Sum256([]byte(token))
	a.mu.Lock()
	if c, ok := a.cache[key]; ok && now().Before(c.expires) {
		a.mu.Unlock()
		return c.caller, c.err
	}
	a.mu.Unlock()

	res, err := a.Reviewer.Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token, Audiences: a.Audiences}}, metav1.CreateOptions{})
	if err != nil {
		return kvindex.Caller{}, fmt.Errorf("reviewing the token: %w", err)
	}
	caller, verr := callerFrom(res, a.Audiences)
	if a.CacheTTL > 0 {
		a.mu.Lock()
		if a.cache == nil || len(a.cache) >= maxCachedReviews {
			a.cache = map[[32]byte]cachedReview{}
		}
		a.cache[key] = cachedReview{caller: caller, err: verr, expires: now().Add(a.CacheTTL)}
		a.mu.Unlock()
	}
	return caller, verr
}

func callerFrom(res *authnv1.TokenReview, audiences []string) (kvindex.Caller, error) {
	st := res.Status
	if !st.Authenticated {
		msg := st.Error
		if msg == "" {
			msg = "token not authenticated"
		}
		return kvindex.Caller{}, fmt.Errorf("%s: %w", msg, kvindex.ErrUnauthenticated)
	}
	if len(audiences) > 0 && !slices.ContainsFunc(st.Audiences, func(a string) bool { return slices.Contains(audiences, a) }) {
		return kvindex.Caller{}, fmt.Errorf("token audiences %v do not include %v: %w", st.Audiences, audiences, kvindex.ErrUnauthenticated)
	}
	c := kvindex.Caller{Username: st.User.Username}
	if rest, ok := strings.CutPrefix(c.Username, "system:serviceaccount:"); ok {
		if ns, name, ok := strings.Cut(rest, ":"); ok {
			c.Namespace, c.ServiceAccount = ns, name
		}
	}
	if v := st.User.Extra["authentication.kubernetes.io/pod-name"]; len(v) == 1 {
		c.PodName = v[0]
	}
	if v := st.User.Extra["authentication.kubernetes.io/pod-uid"]; len(v) == 1 {
		c.PodUID = v[0]
	}
	return c, nil
}
