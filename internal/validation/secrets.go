package validation

import (
	"context"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// SecretAccess answers whether a user may get a Secret of a namespace.
type SecretAccess interface {
	MayGetSecret(ctx context.Context, user authenticationv1.UserInfo, namespace, name string) (allowed bool, reason string, err error)
}

// SubjectAccessReviews is SecretAccess as the API server's authorizer
// answers it: one SubjectAccessReview per question (create
// subjectaccessreviews, internal/controller/rbac.go).
type SubjectAccessReviews struct{ Client client.Client }

// MayGetSecret implements SecretAccess.
func (s SubjectAccessReviews) MayGetSecret(ctx context.Context, user authenticationv1.UserInfo, namespace, name string) (bool, string, error) {
	var extra map[string]authorizationv1.ExtraValue
	if len(user.Extra) > 0 {
		extra = make(map[string]authorizationv1.ExtraValue, len(user.Extra))
		for k, v := range user.Extra {
			extra[k] = authorizationv1.ExtraValue(v)
		}
	}
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user.Username, Groups: user.Groups, UID: user.UID, Extra: extra,
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: namespace, Verb: "get", Resource: "secrets", Name: name},
	}}
	if err := s.Client.Create(ctx, sar); err != nil {
		return false, "", err
	}
	return sar.Status.Allowed && !sar.Status.Denied, sar.Status.Reason, nil
}

// secretRef is a Secret a CacheBackend names: the field that names it, and
// everything that decides where its value goes (use), so that an update
// which leaves use as it was is not asked about again.
type secretRef struct {
	path *field.Path
	name string
	use  string
}

// secretRefs are the Secrets cb names: the RESP credentials of the
// multiprocess server (with the server they are sent to), env values of
// engineOverrides (and optIn) read from a Secret (with the variable they
// become), and the server's image pull secrets.
func secretRefs(cb *v1alpha1.CacheBackend) []secretRef {
	var refs []secretRef
	if mp := cb.Spec.Multiprocess; mp != nil && mp.L2 != nil && mp.L2.RESP != nil && mp.L2.RESP.CredentialsSecretRef != nil {
		r, c := mp.L2.RESP, mp.L2.RESP.CredentialsSecretRef
		refs = append(refs, secretRef{mpPath.Child("l2", "resp", "credentialsSecretRef", "name"), c.Name,
			fmt.Sprintf("resp %q %q %q to %q port %d", c.Name, c.UsernameKey, c.PasswordKey, r.Host, r.Port)})
	}
	if o := cb.Spec.Integration.EngineOverrides; o != nil {
		over := field.NewPath("spec", "integration", "engineOverrides")
		refs = appendEnvSecretRefs(refs, over.Child("env"), "env", o.Env)
		if o.OptIn != nil {
			refs = appendEnvSecretRefs(refs, over.Child("optIn", "env"), "optIn.env", o.OptIn.Env)
		}
	}
	if s := server(cb); s != nil && s.Pod != nil {
		for i, p := range s.Pod.ImagePullSecrets {
			refs = append(refs, secretRef{field.NewPath("spec", "remoteStorage", "lmCacheServer", "pod", "imagePullSecrets").Index(i).Child("name"),
				p.Name, fmt.Sprintf("imagePullSecret %q", p.Name)})
		}
	}
	return refs
}

func appendEnvSecretRefs(refs []secretRef, p *field.Path, list string, env []corev1.EnvVar) []secretRef {
	for i, e := range env {
		if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			continue
		}
		k := e.ValueFrom.SecretKeyRef
		refs = append(refs, secretRef{p.Index(i).Child("valueFrom", "secretKeyRef", "name"), k.Name,
			fmt.Sprintf("%s %q from %q %q", list, e.Name, k.Name, k.Key)})
	}
	return refs
}

// secretErrors refuses the Secrets cb names that the request's user may
// not get: a CacheBackend hands the values of the Secrets it names to
// processes it configures (the RESP password goes to spec.multiprocess's
// l2.resp.host), so naming one must need reading it. On an update, only the
// references whose use changed are asked about: an edit that leaves them
// alone is admitted whoever makes it. A question the API server does not
// answer refuses the reference.
func (h *Handler) secretErrors(ctx context.Context, user authenticationv1.UserInfo, namespace string, old, cb *v1alpha1.CacheBackend) field.ErrorList {
	kept := map[string]bool{}
	if old != nil {
		for _, r := range secretRefs(old) {
			kept[r.use] = true
		}
	}
	var errs field.ErrorList
	type answer struct {
		allowed bool
		why     string
	}
	asked := map[string]answer{}
	for _, r := range secretRefs(cb) {
		if kept[r.use] {
			continue
		}
		a, ok := asked[r.name]
		if !ok {
			if h.Secrets == nil {
				a.why = "the webhook cannot ask the API server whether you may read it"
			} else {
				allowed, reason, err := h.Secrets.MayGetSecret(ctx, user, namespace, r.name)
				switch {
				case err != nil:
					a.why = fmt.Sprintf("the webhook could not ask the API server whether you may read it (%v); try again", err)
				case !allowed:
					a.why = fmt.Sprintf("user %q may not get Secret %q in namespace %q", user.Username, r.name, namespace)
					if reason != "" {
						a.why += " (" + reason + ")"
					}
				default:
					a.allowed = true
				}
			}
			asked[r.name] = a
		}
		if !a.allowed {
			errs = append(errs, field.Forbidden(r.path, a.why+
				": a CacheBackend may name only Secrets its author may read, since the operator hands their values to the processes it configures (docs/security.md)"))
		}
	}
	return errs
}
