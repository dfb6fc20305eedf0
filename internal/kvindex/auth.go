package kvindex

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Caller is an authenticated client of the index.
type Caller struct {
	// Username as the API server reports it, e.g.
	// "system:serviceaccount:team-a:vllm".
	Username string
	// Namespace and ServiceAccount are set for ServiceAccount tokens.
	Namespace      string
	ServiceAccount string
	// PodName and PodUID are set for tokens bound to a pod (projected
	// ServiceAccount tokens are).
	PodName string
	PodUID  string
	// Anonymous is true when the index runs with authentication off.
	Anonymous bool
}

// Errors of authentication and authorisation; the transports map them to
// Unauthenticated / 401 and PermissionDenied / 403.
var (
	ErrUnauthenticated = errors.New("unauthenticated")
	ErrForbidden       = errors.New("forbidden")
)

// Authenticator turns a bearer token into a Caller.
type Authenticator interface {
	Authenticate(ctx context.Context, token string) (Caller, error)
}

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
	caller  Caller
	err     error
	expires time.Time
}

const maxCachedReviews = 4096

// Authenticate implements Authenticator.
func (a *TokenReviewAuthenticator) Authenticate(ctx context.Context, token string) (Caller, error) {
	if token == "" {
		return Caller{}, fmt.Errorf("no bearer token: %w", ErrUnauthenticated)
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
		return Caller{}, fmt.Errorf("reviewing the token: %w", err)
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

func callerFrom(res *authnv1.TokenReview, audiences []string) (Caller, error) {
	st := res.Status
	if !st.Authenticated {
		msg := st.Error
		if msg == "" {
			msg = "token not authenticated"
		}
		return Caller{}, fmt.Errorf("%s: %w", msg, ErrUnauthenticated)
	}
	if len(audiences) > 0 && !slices.ContainsFunc(st.Audiences, func(a string) bool { return slices.Contains(audiences, a) }) {
		return Caller{}, fmt.Errorf("token audiences %v do not include %v: %w", st.Audiences, audiences, ErrUnauthenticated)
	}
	c := Caller{Username: st.User.Username}
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

// AllowAll is the Authenticator for --auth=none (local development and
// tests without an API server): every caller is anonymous and allowed.
type AllowAll struct{}

// Authenticate implements Authenticator.
func (AllowAll) Authenticate(context.Context, string) (Caller, error) {
	return Caller{Username: "anonymous", Anonymous: true}, nil
}

// Policy is the authorisation rule of the index.
//
//   - A subscriber publishes only for a pod of its own ServiceAccount's
//     namespace, under a CacheBackend of that namespace; when its token is
//     bound to a pod (projected tokens are), that pod must be the one it
//     publishes for.
//   - A query client reads only the CacheBackends of its own
//     ServiceAccount's namespace, unless its username is one of
//     ClusterReaders (e.g. the operator's manager, which reads every
//     backend's participation).
type Policy struct {
	ClusterReaders []string
}

// AuthorizePublish checks that caller may publish for the pod.
func (p Policy) AuthorizePublish(caller Caller, backend BackendRef, podNamespace, podName, podUID string) error {
	if caller.Anonymous {
		return nil
	}
	if caller.Namespace == "" {
		return fmt.Errorf("%s is not a ServiceAccount: %w", caller.Username, ErrForbidden)
	}
	if caller.Namespace != podNamespace || caller.Namespace != backend.Namespace {
		return fmt.Errorf("%s may not publish for pod %s/%s of CacheBackend %s: %w", caller.Username, podNamespace, podName, backend, ErrForbidden)
	}
	if caller.PodName != "" && caller.PodName != podName {
		return fmt.Errorf("token bound to pod %s may not publish for pod %s: %w", caller.PodName, podName, ErrForbidden)
	}
	if caller.PodUID != "" && caller.PodUID != podUID {
		return fmt.Errorf("token bound to pod UID %s may not publish for pod UID %s: %w", caller.PodUID, podUID, ErrForbidden)
	}
	return nil
}

// AuthorizeRead checks that caller may query the backend.
func (p Policy) AuthorizeRead(caller Caller, backend BackendRef) error {
	if caller.Anonymous || slices.Contains(p.ClusterReaders, caller.Username) {
		return nil
	}
	if caller.Namespace != "" && caller.Namespace == backend.Namespace {
		return nil
	}
	return fmt.Errorf("%s may not read CacheBackend %s: %w", caller.Username, backend, ErrForbidden)
}
