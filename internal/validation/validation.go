// Package validation holds the CacheBackend rules the CRD schema cannot
// express, and the validating admission webhook that enforces them. The
// schema (enums, bounds, CEL) is checked first by the API server; these
// rules come on top. Every rejection names the field and the limit; what is
// admitted but does not do what it suggests comes back as a warning.
package validation

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/internal/workload"
)

// Path is where the validating webhook is served.
const Path = "/validate-inferencecache-io-v1alpha1-cachebackend"

// Validate returns what is wrong with cb beyond its schema.
func Validate(cb *v1alpha1.CacheBackend) field.ErrorList { return validate(nil, cb) }

// validate is Validate, with the stored object old on an update (nil on a
// create) for the rules that let a stored value stand (server.go).
func validate(old, cb *v1alpha1.CacheBackend) field.ErrorList {
	errs := serverErrors(old, cb)
	errs = append(errs, serverPodErrors(cb)...)
	errs = append(errs, multiprocessErrors(cb)...)
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

	if render.IsStatefulSet(cb) {
		// The StatefulSet controller labels every pod with
		// controller-revision-hash=<name>-<10-character hash>, a label value
		// of at most 63 characters.
		if n := len(cb.Name); n > maxStatefulSetName {
			errs = append(errs, field.Invalid(field.NewPath("metadata", "name"), cb.Name,
				fmt.Sprintf("must be at most %d characters with deploymentKind StatefulSet (it is %d): the pods' controller-revision-hash label is <name>-<hash>", maxStatefulSetName, n)))
		}
		if cb.Spec.Storage != nil && cb.Spec.Storage.PVC != nil {
			// Per-replica claims are <template>-<statefulset>-<ordinal>.
			maxOrdinal := 100
			if cb.Spec.Autoscaling != nil {
				maxOrdinal = int(cb.Spec.Autoscaling.MaxReplicas)
			} else if r := render.Replicas(cb); int(r) > maxOrdinal {
				maxOrdinal = int(r)
			}
			claim := fmt.Sprintf("%s-%s-%d", render.DataVolumeName, cb.Name, maxOrdinal-1)
			if len(claim) > validation.DNS1123SubdomainMaxLength {
				errs = append(errs, field.Invalid(field.NewPath("metadata", "name"), cb.Name,
					fmt.Sprintf("the StatefulSet's claim names (%s) would exceed %d characters", claim, validation.DNS1123SubdomainMaxLength)))
			}
		}
	}

	integ := spec.Child("integration")
	if c := cb.Spec.Integration.EngineContainer; c != "" {
		for _, msg := range validation.IsDNS1123Label(c) {
			errs = append(errs, field.Invalid(integ.Child("engineContainer"), c, "container name: "+msg))
		}
	}
	if o := cb.Spec.Integration.EngineOverrides; o != nil {
		over := integ.Child("engineOverrides")
		errs = append(errs, validateOverrideArgs(cb, over.Child("args"), o.Args)...)
		errs = append(errs, validateOverrideEnv(over.Child("env"), o.Env)...)
		if in := o.OptIn; in != nil {
			optIn := over.Child("optIn")
			errs = append(errs, validateOverrideArgs(cb, optIn.Child("args"), in.Args)...)
			errs = append(errs, validateOverrideEnv(optIn.Child("env"), in.Env)...)
			for i, e := range in.Env {
				if slices.ContainsFunc(o.Env, func(x corev1.EnvVar) bool { return x.Name == e.Name }) {
					errs = append(errs, field.Duplicate(optIn.Child("env").Index(i).Child("name"), e.Name))
				}
			}
		}
	}
	errs = append(errs, validateHiCache(cb)...)
	errs = append(errs, expansionErrors(cb)...)
	return append(errs, allowListErrors(cb, errs)...)
}

// expansionErrors refuses, in every value of the spec that becomes a
// container's argument or env value, a "$(" the kubelet would expand from
// that container's environment: engineOverrides (optIn too), the LMCache
// local disk path (the engines' LMCACHE_LOCAL_DISK), the observed model
// (the sidecar's MODEL_ID) and the multiprocess server's disk path (its
// --l2-adapter argument).
func expansionErrors(cb *v1alpha1.CacheBackend) field.ErrorList {
	var errs field.ErrorList
	check := func(p *field.Path, v string) {
		if inject.ExpandsVariable(v) {
			errs = append(errs, field.Invalid(p, v, inject.ExpandsVariableMessage))
		}
	}
	over := field.NewPath("spec", "integration", "engineOverrides")
	lists := func(p *field.Path, args []string, env []corev1.EnvVar) {
		for i, a := range args {
			check(p.Child("args").Index(i), a)
		}
		for i, e := range env {
			check(p.Child("env").Index(i).Child("value"), e.Value)
		}
	}
	if o := cb.Spec.Integration.EngineOverrides; o != nil {
		lists(over, o.Args, o.Env)
		if o.OptIn != nil {
			lists(over.Child("optIn"), o.OptIn.Args, o.OptIn.Env)
		}
	}
	if lc := cb.Spec.LMCache; lc != nil && lc.LocalDisk != nil {
		check(field.NewPath("spec", "lmCache", "localDisk", "path"), lc.LocalDisk.Path)
	}
	if o := cb.Spec.Observation; o != nil {
		check(field.NewPath("spec", "observation", "modelID"), o.ModelID)
	}
	if mp := cb.Spec.Multiprocess; mp != nil && mp.L2 != nil && mp.L2.Disk != nil {
		check(mpPath.Child("l2", "disk", "path"), mp.L2.Disk.Path)
	}
	return errs
}

// allowListErrors refuses what engineOverrides.args and .env hold outside
// the allow-list, except the entries refused already (an owned flag, a
// denied name, a flag SGLang refuses with HiCache): one refusal per entry,
// the most specific.
func allowListErrors(cb *v1alpha1.CacheBackend, refused field.ErrorList) field.ErrorList {
	o := cb.Spec.Integration.EngineOverrides
	if o == nil {
		return nil
	}
	over := field.NewPath("spec", "integration", "engineOverrides")
	isRefused := func(p *field.Path) bool {
		return slices.ContainsFunc(refused, func(e *field.Error) bool { return e.Field == p.String() })
	}
	var errs field.ErrorList
	for _, r := range inject.ArgsNotAllowed(cb.Spec.Runtime, o.Args) {
		if p := over.Child("args").Index(r.Index); !isRefused(p) {
			errs = append(errs, field.Forbidden(p, r.Message))
		}
	}
	for i, e := range o.Env {
		p := over.Child("env").Index(i).Child("name")
		if why := inject.EnvNotAllowed(cb.Spec.Runtime, cb.Spec.Type, e); why != "" && !isRefused(p) {
			errs = append(errs, field.Forbidden(p, why))
		}
	}
	return errs
}

// validateOverrideArgs refuses the flags the injection owns, in any
// spelling the engine reads, in args (engineOverrides.args or optIn.args).
func validateOverrideArgs(cb *v1alpha1.CacheBackend, p *field.Path, args []string) field.ErrorList {
	var errs field.ErrorList
	owned := ownedFlags(cb.Spec.Type)
	abbrev := inject.Abbreviates(cb.Spec.Runtime)
	for i, a := range args {
		key, _, _ := strings.Cut(a, "=")
		for _, name := range slices.Sorted(maps.Keys(owned)) {
			if inject.SpellsFlag(key, name, abbrev) {
				errs = append(errs, field.Forbidden(p.Index(i), fmt.Sprintf("%s is %s, set by the injection (%s)", key, name, owned[name])))
				break
			}
		}
	}
	return errs
}

// validateOverrideEnv refuses, in env (engineOverrides.env or optIn.env),
// names that are not env names, the cache address and the names the
// operator never injects.
func validateOverrideEnv(p *field.Path, env []corev1.EnvVar) field.ErrorList {
	var errs field.ErrorList
	for i, e := range env {
		name := p.Index(i).Child("name")
		for _, msg := range validation.IsEnvVarName(e.Name) {
			errs = append(errs, field.Invalid(name, e.Name, msg))
		}
		if e.Name == "LMCACHE_REMOTE_URL" {
			errs = append(errs, field.Forbidden(name, "LMCACHE_REMOTE_URL is derived from the backend's spec and cannot be overridden"))
		}
		if why := inject.EnvNameDenied(e.Name); why != "" {
			errs = append(errs, field.Forbidden(name, why+"; engineOverrides may not set it (see docs/security.md)"))
		}
	}
	return errs
}

// maxStatefulSetName keeps <name>-<10-character hash> within a label value.
const maxStatefulSetName = validation.LabelValueMaxLength - 11

// ValidateUpdate returns what is wrong with a change from old to cb: the
// rules of Validate, and that a Deployment's shared claim never shrinks.
func ValidateUpdate(old, cb *v1alpha1.CacheBackend) field.ErrorList {
	errs := validate(old, cb)
	if workload.For(cb).ClaimsPerReplica() || workload.For(old).ClaimsPerReplica() || old.Spec.Storage == nil || old.Spec.Storage.PVC == nil ||
		cb.Spec.Storage == nil || cb.Spec.Storage.PVC == nil {
		return errs
	}
	if was, now := old.Spec.Storage.PVC.Size, cb.Spec.Storage.PVC.Size; now.Cmp(was) < 0 {
		errs = append(errs, field.Forbidden(field.NewPath("spec", "storage", "pvc", "size"),
			fmt.Sprintf("cannot shrink from %s to %s: a PersistentVolumeClaim only grows", was.String(), now.String())))
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
	// Secrets answers whether the requesting user may read a Secret the
	// CacheBackend names (secretErrors); nil refuses every new reference.
	Secrets SecretAccess
}

// Handle implements admission.Handler.
func (h *Handler) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed("")
	}
	cb := &v1alpha1.CacheBackend{}
	if err := h.Decoder.Decode(req, cb); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	errs := Validate(cb)
	var old *v1alpha1.CacheBackend
	if req.Operation == admissionv1.Update {
		old = &v1alpha1.CacheBackend{}
		if err := h.Decoder.DecodeRaw(req.OldObject, old); err != nil {
			return admission.Errored(http.StatusBadRequest, err)
		}
		errs = ValidateUpdate(old, cb)
	}
	ns := req.Namespace
	if ns == "" {
		ns = cb.Namespace
	}
	errs = append(errs, h.secretErrors(ctx, req.UserInfo, ns, old, cb)...)
	if len(errs) == 0 {
		return admission.Allowed("").WithWarnings(append(HiCacheWarnings(cb), Warnings(old, cb)...)...)
	}
	st := apierrors.NewInvalid(v1alpha1.GroupVersion.WithKind("CacheBackend").GroupKind(), cb.Name, errs).Status()
	return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &st}}
}
