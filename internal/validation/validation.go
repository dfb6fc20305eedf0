// Package validation holds the CacheBackend rules the CRD schema cannot
// express, and the validating admission webhook that enforces them. The
// schema (enums, bounds, CEL) is checked first by the API server; these
// rules come on top. Every rejection names the field and the limit.
package validation

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
)

// Path is where the validating webhook is served.
const Path = "/validate-inferencecache-io-v1alpha1-cachebackend"

// Validate returns what is wrong with cb beyond its schema.
func Validate(cb *v1alpha1.CacheBackend) field.ErrorList {
	var errs field.ErrorList
	spec := field.NewPath("spec")

	sel := spec.Child("engineSelector", "matchLabels")
	for k, v := range cb.Spec.EngineSelector.MatchLabels {
		for _, msg := range validation.IsQualifiedName(k) {
			errs = append(errs, field.Invalid(sel.Key(k), k, "label key: "+msg))
		}
		for _, msg := range validation.IsValidLabelValue(v) {
			errs = append(errs, field.Invalid(sel.Key(k), v, "label value: "+msg))
		}
	}

	integ := spec.Child("integration")
	if c := cb.Spec.Integration.EngineContainer; c != "" {
		for _, msg := range validation.IsDNS1123Label(c) {
			errs = append(errs, field.Invalid(integ.Child("engineContainer"), c, "container name: "+msg))
		}
	}
	if o := cb.Spec.Integration.EngineOverrides; o != nil {
		owned := ownedFlags(cb.Spec.Type)
		for i, a := range o.Args {
			name, _, _ := strings.Cut(a, "=")
			if reason, ok := owned[name]; ok {
				errs = append(errs, field.Forbidden(integ.Child("engineOverrides", "args").Index(i),
					fmt.Sprintf("%s is set by the injection (%s)", name, reason)))
			}
		}
		for i, e := range o.Env {
			p := integ.Child("engineOverrides", "env").Index(i).Child("name")
			for _, msg := range validation.IsEnvVarName(e.Name) {
				errs = append(errs, field.Invalid(p, e.Name, msg))
			}
			if e.Name == "LMCACHE_REMOTE_URL" {
				errs = append(errs, field.Forbidden(p, "LMCACHE_REMOTE_URL is the backend's status.endpoint and cannot be overridden"))
			}
		}
	}
	return errs
}

func ownedFlags(t v1alpha1.BackendType) map[string]string {
	if t == v1alpha1.BackendTypeSGLangHiCache {
		m := map[string]string{"--enable-hierarchical-cache": "always set for SGLangHiCache", "--page-size": "set spec.hiCache.pageSize"}
		for _, f := range []string{"ratio", "size", "write-policy", "io-backend", "mem-layout", "storage-backend", "storage-prefetch-policy"} {
			m["--hicache-"+f] = "set it in spec.hiCache"
		}
		return m
	}
	return map[string]string{
		inject.KVTransferConfigFlag: "derived from spec.integration.role",
		inject.KVEventsConfigFlag:   "set with the kvevent-subscriber sidecar",
	}
}

// +kubebuilder:webhookconfiguration:mutating=false,name=inferencecache-cachebackend-validator
// +kubebuilder:webhook:path=/validate-inferencecache-io-v1alpha1-cachebackend,mutating=false,failurePolicy=fail,sideEffects=None,groups=inferencecache.io,resources=cachebackends,verbs=create;update,versions=v1alpha1,name=validate.cachebackend.inferencecache.io,admissionReviewVersions=v1,timeoutSeconds=5

// Handler is the validating webhook for CacheBackends.
type Handler struct {
	Decoder admission.Decoder
}

// Handle implements admission.Handler.
func (h *Handler) Handle(_ context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed("")
	}
	cb := &v1alpha1.CacheBackend{}
	if err := h.Decoder.Decode(req, cb); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	errs := Validate(cb)
	if len(errs) == 0 {
		return admission.Allowed("")
	}
	st := apierrors.NewInvalid(v1alpha1.GroupVersion.WithKind("CacheBackend").GroupKind(), cb.Name, errs).Status()
	return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &st}}
}
