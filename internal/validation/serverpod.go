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
