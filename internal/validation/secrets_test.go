package validation

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// fakeAccess answers MayGetSecret from readable, or with err, and records
// the questions.
type fakeAccess struct {
	readable map[string]bool
	err      error
	asked    []string
}

func (f *fakeAccess) MayGetSecret(_ context.Context, user authenticationv1.UserInfo, namespace, name string) (bool, string, error) {
	f.asked = append(f.asked, user.Username+" "+namespace+"/"+name)
	return f.readable[name], "", f.err
}

func respBackend(host string) *v1alpha1.CacheBackend {
	cb := lmcacheBackend(nil, false)
	cb.Spec.RemoteStorage = nil
	cb.Spec.Multiprocess = &v1alpha1.Multiprocess{L1: v1alpha1.MultiprocessL1{Size: resource.MustParse("1Gi")},
		L2: &v1alpha1.MultiprocessL2{RESP: &v1alpha1.MultiprocessRESP{Host: host, Port: 6379, Capacity: resource.MustParse("1Gi"),
			CredentialsSecretRef: &v1alpha1.RESPCredentials{Name: "redis-auth", PasswordKey: "password"}}}}
	return cb
}

// TestHandlerAsksBeforeASecretIsNamed: the webhook asks, for the
// requesting user, about each Secret a CacheBackend newly names, and
// refuses with the field path when the answer is no, when there is no
// answer (fail closed) and when it cannot ask at all; an update that
// leaves the reference and its destination alone asks nothing.
func TestHandlerAsksBeforeASecretIsNamed(t *testing.T) {
	scheme := runtime.NewScheme()
	require.NoError(t, v1alpha1.AddToScheme(scheme))
	const path = "spec.multiprocess.l2.resp.credentialsSecretRef.name"
	handle := func(access SecretAccess, op admissionv1.Operation, cb, old *v1alpha1.CacheBackend) admission.Response {
		raw, err := json.Marshal(cb)
		require.NoError(t, err)
		req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Operation: op, Namespace: "llm",
			UserInfo: authenticationv1.UserInfo{Username: "mallory"}, Object: runtime.RawExtension{Raw: raw}}}
		if old != nil {
			req.OldObject.Raw, err = json.Marshal(old)
			require.NoError(t, err)
		}
		return (&Handler{Decoder: admission.NewDecoder(scheme), Secrets: access}).Handle(context.Background(), req)
	}
	refused := func(t *testing.T, resp admission.Response, text string) {
		t.Helper()
		assert.False(t, resp.Allowed)
		require.NotNil(t, resp.Result)
		assert.Contains(t, resp.Result.Message, path+": Forbidden: "+text)
	}

	no := &fakeAccess{}
	refused(t, handle(no, admissionv1.Create, respBackend("redis"), nil), `user "mallory" may not get Secret "redis-auth" in namespace "llm"`)
	assert.Equal(t, []string{"mallory llm/redis-auth"}, no.asked)

	yes := &fakeAccess{readable: map[string]bool{"redis-auth": true}}
	assert.True(t, handle(yes, admissionv1.Create, respBackend("redis"), nil).Allowed)

	broken := &fakeAccess{readable: map[string]bool{"redis-auth": true}, err: errors.New("connection refused")}
	refused(t, handle(broken, admissionv1.Create, respBackend("redis"), nil), "the webhook could not ask the API server whether you may read it (connection refused)")
	refused(t, handle(nil, admissionv1.Create, respBackend("redis"), nil), "the webhook cannot ask")

	// Updates: an unrelated edit asks nothing; a new destination asks.
	no.asked = nil
	edited := respBackend("redis")
	edited.Spec.EngineSelector.MatchLabels = map[string]string{"tier": "gold"}
	assert.True(t, handle(no, admissionv1.Update, edited, respBackend("redis")).Allowed)
	assert.True(t, handle(nil, admissionv1.Update, edited, respBackend("redis")).Allowed)
	assert.Empty(t, no.asked)
	refused(t, handle(no, admissionv1.Update, respBackend("collector.attacker.example"), respBackend("redis")), `user "mallory" may not get Secret "redis-auth"`)
	assert.True(t, handle(no, admissionv1.Update, lmcacheBackend(nil, false), respBackend("redis")).Allowed, "dropping the reference")
}

// TestSubjectAccessReviewCarriesTheUser: the review asks about get on
// the named Secret of the namespace, for the request's user with their
// groups, UID and extra, and its answer is the verdict.
func TestSubjectAccessReviewCarriesTheUser(t *testing.T) {
	var got authorizationv1.SubjectAccessReviewSpec
	allowed := true
	c := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(_ context.Context, _ client.WithWatch, obj client.Object, _ ...client.CreateOption) error {
			sar := obj.(*authorizationv1.SubjectAccessReview)
			got = sar.Spec
			sar.Status = authorizationv1.SubjectAccessReviewStatus{Allowed: allowed, Reason: "a reason"}
			return nil
		}}).Build()
	user := authenticationv1.UserInfo{Username: "alice", UID: "u-1", Groups: []string{"team-a", "system:authenticated"},
		Extra: map[string]authenticationv1.ExtraValue{"scopes": {"x"}}}
	ok, _, err := SubjectAccessReviews{Client: c}.MayGetSecret(context.Background(), user, "llm", "redis-auth")
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, authorizationv1.SubjectAccessReviewSpec{User: "alice", UID: "u-1", Groups: []string{"team-a", "system:authenticated"},
		Extra:              map[string]authorizationv1.ExtraValue{"scopes": {"x"}},
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: "llm", Verb: "get", Resource: "secrets", Name: "redis-auth"}}, got)
	allowed = false
	ok, reason, err := SubjectAccessReviews{Client: c}.MayGetSecret(context.Background(), user, "llm", "redis-auth")
	require.NoError(t, err)
	assert.False(t, ok)
	assert.Equal(t, "a reason", reason)
}
