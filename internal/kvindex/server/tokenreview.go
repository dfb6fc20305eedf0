package server

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/lru"

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
//
// What an unauthenticated caller can cost is bounded: a token that is not
// shaped like a JWT (every ServiceAccount token is one) is refused without
// a review; accepted and refused verdicts are kept in two LRU caches of
// MaxCachedReviews each, so that junk tokens never evict a legitimate
// caller's verdict; and reviews of tokens in neither cache are limited to
// ReviewsPerSecond (with a burst of as many), beyond which the token is
// refused for now (the caller retries).
type TokenReviewAuthenticator struct {
	Reviewer  TokenReviewer
	Audiences []string
	CacheTTL  time.Duration
	Now       func() time.Time
	// MaxCachedReviews bounds each verdict cache (DefaultMaxCachedReviews
	// when zero).
	MaxCachedReviews int
	// ReviewsPerSecond bounds the TokenReviews of uncached tokens
	// (DefaultReviewsPerSecond when zero).
	ReviewsPerSecond float64

	once              sync.Once
	accepted, refused *lru.Cache
	limiter           *rate.Limiter
}

type cachedReview struct {
	caller  kvindex.Caller
	err     error
	expires time.Time
}

const (
	// DefaultMaxCachedReviews is each verdict cache's size.
	DefaultMaxCachedReviews = 4096
	// DefaultReviewsPerSecond is the rate of TokenReviews of uncached
	// tokens: a thousand engine pods restarting at once are all reviewed
	// within 20 s.
	DefaultReviewsPerSecond = 50
)

func (a *TokenReviewAuthenticator) init() {
	size := a.MaxCachedReviews
	if size <= 0 {
		size = DefaultMaxCachedReviews
	}
	qps := a.ReviewsPerSecond
	if qps <= 0 {
		qps = DefaultReviewsPerSecond
	}
	a.accepted, a.refused = lru.New(size), lru.New(size)
	a.limiter = rate.NewLimiter(rate.Limit(qps), max(int(qps), 1))
}

// Authenticate implements kvindex.Authenticator.
func (a *TokenReviewAuthenticator) Authenticate(ctx context.Context, token string) (kvindex.Caller, error) {
	if token == "" {
		return kvindex.Caller{}, fmt.Errorf("no bearer token: %w", kvindex.ErrUnauthenticated)
	}
	if !jwtShaped(token) {
		return kvindex.Caller{}, fmt.Errorf("the bearer token is not a JWT: %w", kvindex.ErrUnauthenticated)
	}
	a.once.Do(a.init)
	now := time.Now
	if a.Now != nil {
		now = a.Now
	}
	key := sha256.Sum256([]byte(token))
	if r, ok := fresh(a.accepted, key, now()); ok {
		return r.caller, r.err
	}
	if r, ok := fresh(a.refused, key, now()); ok {
		return r.caller, r.err
	}
	if !a.limiter.AllowN(now(), 1) {
		return kvindex.Caller{}, fmt.Errorf("too many TokenReviews of unknown tokens; try again: %w", kvindex.ErrUnauthenticated)
	}
	res, err := a.Reviewer.Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token, Audiences: a.Audiences}}, metav1.CreateOptions{})
	if err != nil {
		return kvindex.Caller{}, fmt.Errorf("reviewing the token: %w", err)
	}
	caller, verr := callerFrom(res, a.Audiences)
	if a.CacheTTL > 0 {
		c := a.accepted
		if verr != nil {
			c = a.refused
		}
		c.Add(key, cachedReview{caller: caller, err: verr, expires: now().Add(a.CacheTTL)})
	}
	return caller, verr
}

// fresh returns the verdict c holds for key while it has not expired at
// now, and drops an expired one.
func fresh(c *lru.Cache, key [32]byte, now time.Time) (cachedReview, bool) {
	v, ok := c.Get(key)
	if !ok {
		return cachedReview{}, false
	}
	if r := v.(cachedReview); now.Before(r.expires) {
		return r, true
	}
	c.Remove(key)
	return cachedReview{}, false
}

// jwtShaped reports whether token has a JWT's compact form: three
// non-empty base64url segments separated by dots.
func jwtShaped(token string) bool {
	dots, seg := 0, 0
	for i := 0; i < len(token); i++ {
		switch c := token[i]; {
		case c == '.':
			if seg == 0 {
				return false
			}
			dots, seg = dots+1, 0
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
			seg++
		default:
			return false
		}
	}
	return dots == 2 && seg > 0
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
