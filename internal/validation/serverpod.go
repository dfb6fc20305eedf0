package validation

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/render"
)

// serverPodErrors checks spec.remoteStorage.lmCacheServer.pod as the API
// server would check the pod template it becomes, for what would make
// the workload's apply fail (and the server never start): label,
// annotation and node-selector keys and values, names, tolerations and
// spread constraints. Labels the operator's selectors own are refused:
// they would move a pod out of its own Deployment.
func serverPodErrors(cb *v1alpha1.CacheBackend) field.ErrorList {
	if cb.Spec.RemoteStorage == nil || cb.Spec.RemoteStorage.LMCacheServer == nil || cb.Spec.RemoteStorage.LMCacheServer.Pod == nil {
		return nil
	}
	p := cb.Spec.RemoteStorage.LMCacheServer.Pod
	path := field.NewPath("spec", "remoteStorage", "lmCacheServer", "pod")
	errs := metav1validation.ValidateLabels(p.Labels, path.Child("labels"))
	owned := render.Labels(cb)
	for k := range p.Labels {
		if _, ok := owned[k]; ok {
			errs = append(errs, field.Forbidden(path.Child("labels").Key(k), "set by the operator on every server pod (its selectors use it)"))
		}
	}
	errs = append(errs, apimachineryvalidation.ValidateAnnotations(p.Annotations, path.Child("annotations"))...)
	errs = append(errs, metav1validation.ValidateLabels(p.NodeSelector, path.Child("nodeSelector"))...)
	if p.PriorityClassName != "" {
		for _, msg := range validation.IsDNS1123Subdomain(p.PriorityClassName) {
			errs = append(errs, field.Invalid(path.Child("priorityClassName"), p.PriorityClassName, msg))
		}
	}
	for i, s := range p.ImagePullSecrets {
		f := path.Child("imagePullSecrets").Index(i).Child("name")
		if s.Name == "" {
			errs = append(errs, field.Required(f, "the Secret's name"))
			continue
		}
		for _, msg := range validation.IsDNS1123Subdomain(s.Name) {
			errs = append(errs, field.Invalid(f, s.Name, msg))
		}
	}
	for i, t := range p.Tolerations {
		errs = append(errs, tolerationErrors(t, path.Child("tolerations").Index(i))...)
	}
	for i, c := range p.TopologySpreadConstraints {
		f := path.Child("topologySpreadConstraints").Index(i).Child("topologyKey")
		for _, msg := range validation.IsQualifiedName(c.TopologyKey) {
			errs = append(errs, field.Invalid(f, c.TopologyKey, msg))
		}
	}
	if p.Affinity != nil {
		errs = append(errs, affinityErrors(p.Affinity, path.Child("affinity"))...)
	}
	errs = append(errs, rootErrors(p, path)...)
	if sc := p.SecurityContext; sc != nil && sc.SeccompProfile != nil {
		errs = append(errs, seccompErrors(sc.SeccompProfile, path.Child("securityContext", "seccompProfile"))...)
	}
	if sc := p.ContainerSecurityContext; sc != nil && sc.SeccompProfile != nil {
		errs = append(errs, seccompErrors(sc.SeccompProfile, path.Child("containerSecurityContext", "seccompProfile"))...)
	}
	return errs
}

// tolerationErrors are the API server's toleration rules the schema's
// enums and bounds leave (the pod validation of k8s.io/kubernetes, which is
// not importable).
func tolerationErrors(t v1alpha1.ServerToleration, f *field.Path) field.ErrorList {
	var errs field.ErrorList
	if t.Key != "" {
		for _, msg := range validation.IsQualifiedName(t.Key) {
			errs = append(errs, field.Invalid(f.Child("key"), t.Key, msg))
		}
	}
	switch t.Operator {
	case corev1.TolerationOpEqual, "":
		if t.Key == "" {
			errs = append(errs, field.Invalid(f.Child("operator"), t.Operator, "operator must be Exists when key is empty, which means match all values and all keys"))
		}
		for _, msg := range validation.IsValidLabelValue(t.Value) {
			errs = append(errs, field.Invalid(f.Child("value"), t.Value, msg))
		}
	case corev1.TolerationOpExists:
		if t.Value != "" {
			errs = append(errs, field.Invalid(f.Child("operator"), t.Value, "value must be empty when `operator` is 'Exists'"))
		}
	}
	if t.TolerationSeconds != nil && t.Effect != corev1.TaintEffectNoExecute {
		errs = append(errs, field.Invalid(f.Child("effect"), t.Effect, fmt.Sprintf("effect must be '%s' when `tolerationSeconds` is set", corev1.TaintEffectNoExecute)))
	}
	return errs
}

// seccompErrors: a localhost profile names its path, and only then.
func seccompErrors(p *v1alpha1.ServerSeccompProfile, f *field.Path) field.ErrorList {
	switch {
	case p.Type == corev1.SeccompProfileTypeLocalhost && p.LocalhostProfile == "":
		return field.ErrorList{field.Required(f.Child("localhostProfile"), "must be set when seccomp type is Localhost")}
	case p.Type != corev1.SeccompProfileTypeLocalhost && p.LocalhostProfile != "":
		return field.ErrorList{field.Invalid(f.Child("localhostProfile"), p.LocalhostProfile, "can only be set when seccomp type is Localhost")}
	}
	return nil
}

// rootErrors refuses user ID 0 where the pod's effective runAsNonRoot (the
// container's over the pod's, and the operator's default true when the
// spec names no identity) is true: the kubelet would refuse to start the
// container ("runAsNonRoot and image will run as root"), so the server
// would never run. The defaults apply to servers the operator creates from
// now on (render.ServerPodDefaults); the rule is the same for all, so an
// opted-in older server cannot fall into it.
func rootErrors(p *v1alpha1.ServerPod, path *field.Path) field.ErrorList {
	eff := render.ServerPodDefaults(p)
	psc, csc := eff.SecurityContext, eff.ContainerSecurityContext
	nonRoot := csc.RunAsNonRoot
	if nonRoot == nil {
		nonRoot = psc.RunAsNonRoot
	}
	if nonRoot == nil || !*nonRoot {
		return nil
	}
	const msg = "user 0 is root while runAsNonRoot is true; set runAsNonRoot: false to run the server as root"
	switch {
	case csc.RunAsUser != nil:
		if *csc.RunAsUser == 0 {
			return field.ErrorList{field.Invalid(path.Child("containerSecurityContext", "runAsUser"), int64(0), msg)}
		}
	case psc.RunAsUser != nil && *psc.RunAsUser == 0:
		return field.ErrorList{field.Invalid(path.Child("securityContext", "runAsUser"), int64(0), msg)}
	}
	return nil
}

// affinityErrors are the API server's rules for node selector requirements
// and pod affinity terms that the schema's enums and bounds leave.
func affinityErrors(a *v1alpha1.ServerAffinity, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if na := a.NodeAffinity; na != nil {
		f := path.Child("nodeAffinity")
		if r := na.RequiredDuringSchedulingIgnoredDuringExecution; r != nil {
			for i, t := range r.NodeSelectorTerms {
				errs = append(errs, nodeSelectorTermErrors(t, f.Child("requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms").Index(i))...)
			}
		}
		for i, p := range na.PreferredDuringSchedulingIgnoredDuringExecution {
			errs = append(errs, nodeSelectorTermErrors(p.Preference, f.Child("preferredDuringSchedulingIgnoredDuringExecution").Index(i).Child("preference"))...)
		}
	}
	if pa := a.PodAntiAffinity; pa != nil {
		f := path.Child("podAntiAffinity")
		for i, t := range pa.RequiredDuringSchedulingIgnoredDuringExecution {
			errs = append(errs, qualifiedNameErrors(t.TopologyKey, f.Child("requiredDuringSchedulingIgnoredDuringExecution").Index(i).Child("topologyKey"))...)
		}
		for i, w := range pa.PreferredDuringSchedulingIgnoredDuringExecution {
			errs = append(errs, qualifiedNameErrors(w.PodAffinityTerm.TopologyKey, f.Child("preferredDuringSchedulingIgnoredDuringExecution").Index(i).Child("podAffinityTerm", "topologyKey"))...)
		}
	}
	return errs
}

func nodeSelectorTermErrors(t v1alpha1.ServerNodeSelectorTerm, f *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, e := range t.MatchExpressions {
		ef := f.Child("matchExpressions").Index(i)
		errs = append(errs, qualifiedNameErrors(e.Key, ef.Child("key"))...)
		switch e.Operator {
		case corev1.NodeSelectorOpIn, corev1.NodeSelectorOpNotIn:
			if len(e.Values) == 0 {
				errs = append(errs, field.Required(ef.Child("values"), "must be specified when `operator` is 'In' or 'NotIn'"))
			}
		case corev1.NodeSelectorOpExists, corev1.NodeSelectorOpDoesNotExist:
			if len(e.Values) > 0 {
				errs = append(errs, field.Forbidden(ef.Child("values"), "may not be specified when `operator` is 'Exists' or 'DoesNotExist'"))
			}
		case corev1.NodeSelectorOpGt, corev1.NodeSelectorOpLt:
			if len(e.Values) != 1 {
				errs = append(errs, field.Required(ef.Child("values"), "must be specified single value when `operator` is 'Lt' or 'Gt'"))
			}
		}
	}
	return errs
}

func qualifiedNameErrors(v string, f *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range validation.IsQualifiedName(v) {
		errs = append(errs, field.Invalid(f, v, msg))
	}
	return errs
}
