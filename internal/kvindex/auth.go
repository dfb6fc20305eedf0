package kvindex

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
//     namespace, under a CacheBackend of that namespace, with a token bound
//     to that very pod (the projected token the webhook mounts is).
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
	if caller.PodName == "" || caller.PodUID == "" {
		// A token of the namespace that names no pod (kubectl create
		// token, which the built-in edit role allows) could otherwise act
		// for every pod there: replace their streams, wipe their blocks.
		return fmt.Errorf("%s publishes with a token bound to no pod; only the pod's own projected token may publish: %w", caller.Username, ErrForbidden)
	}
	if caller.PodName != podName {
		return fmt.Errorf("token bound to pod %s may not publish for pod %s: %w", caller.PodName, podName, ErrForbidden)
	}
	if caller.PodUID != podUID {
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
