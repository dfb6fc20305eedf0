// Package cli implements kubectl-cachebackend, the operator's command line:
// previews built from the same packages as the controller and the webhook
// (render, inject), and explanations of live pods. It writes nothing to a
// cluster.
package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/internal/validation"
)

// Documents splits multi-document YAML (or JSON) into objects.
func Documents(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for i := 1; ; i++ {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
}

// ReadFile reads the objects of a file, or of a kustomization built in
// process when kustomize is true.
func ReadFile(path string, kustomize bool) ([]*unstructured.Unstructured, error) {
	if kustomize {
		rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), path)
		if err != nil {
			return nil, fmt.Errorf("kustomize build %s: %w", path, err)
		}
		var out []*unstructured.Unstructured
		for _, r := range rm.Resources() {
			// Through JSON, so numbers are int64 as from the API server.
			raw, err := r.MarshalJSON()
			if err != nil {
				return nil, err
			}
			u := &unstructured.Unstructured{}
			if err := u.UnmarshalJSON(raw); err != nil {
				return nil, err
			}
			out = append(out, u)
		}
		return out, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Documents(data)
}

// Backends decodes the CacheBackends among objs, strictly: an unknown field
// or an invalid value is an error naming the object and the field. It is an
// error when there is none.
func Backends(objs []*unstructured.Unstructured) ([]*v1alpha1.CacheBackend, error) {
	var out []*v1alpha1.CacheBackend
	for _, o := range objs {
		if o.GetKind() != "CacheBackend" {
			continue
		}
		if o.GetAPIVersion() != v1alpha1.GroupVersion.String() {
			return nil, fmt.Errorf("CacheBackend %s: apiVersion %q is not %s", o.GetName(), o.GetAPIVersion(), v1alpha1.GroupVersion)
		}
		raw, err := o.MarshalJSON()
		if err != nil {
			return nil, err
		}
		cb := &v1alpha1.CacheBackend{}
		if err := yaml.UnmarshalStrict(raw, cb); err != nil {
			return nil, fmt.Errorf("CacheBackend %s: %w", o.GetName(), err)
		}
		if cb.Namespace == "" {
			cb.Namespace = "default"
		}
		if err := Check(cb); err != nil {
			return nil, fmt.Errorf("CacheBackend %s/%s is invalid: %w", cb.Namespace, cb.Name, err)
		}
		out = append(out, cb)
	}
	if len(out) == 0 {
		kinds := make([]string, 0, len(objs))
		for _, o := range objs {
			kinds = append(kinds, o.GetKind())
		}
		return nil, fmt.Errorf("no CacheBackend (%s/CacheBackend) in the input; found: %s", v1alpha1.GroupVersion, strings.Join(kinds, ", "))
	}
	return out, nil
}

// Check applies offline the rules the API server enforces that matter for a
// preview: required and enumerated values, the cross-field rules, and the
// validating webhook's rules. The API server remains the authority.
func Check(cb *v1alpha1.CacheBackend) error {
	var errs []string
	add := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	s := cb.Spec
	if s.Runtime == "" {
		s.Runtime = v1alpha1.RuntimeVLLM
	}
	switch s.Type {
	case v1alpha1.BackendTypeLMCache:
		if s.Runtime != v1alpha1.RuntimeVLLM {
			add("spec.runtime: type LMCache needs runtime VLLM")
		}
	case v1alpha1.BackendTypeSGLangHiCache:
		if s.Runtime != v1alpha1.RuntimeSGLang {
			add("spec.runtime: type SGLangHiCache needs runtime SGLang")
		}
	case "":
		add("spec.type: Required value")
	default:
		add("spec.type: Unsupported value %q: supported values: LMCache, SGLangHiCache", s.Type)
	}
	if k := s.DeploymentKind; k != "" && k != v1alpha1.DeploymentKindDeployment && k != v1alpha1.DeploymentKindStatefulSet {
		add("spec.deploymentKind: Unsupported value %q: supported values: Deployment, StatefulSet", k)
	}
	if r := s.Integration.Role; r != "" && r != v1alpha1.RoleReadWrite && r != v1alpha1.RoleReadOnly && r != v1alpha1.RoleWriteOnly {
		add("spec.integration.role: Unsupported value %q: supported values: ReadWrite, ReadOnly, WriteOnly", r)
	}
	if a := s.Autoscaling; a != nil && a.MinReplicas != nil && *a.MinReplicas > a.MaxReplicas {
		add("spec.autoscaling: minReplicas must be less than or equal to maxReplicas")
	}
	for _, e := range validation.Validate(cb) {
		errs = append(errs, e.Error())
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// RenderYAML prints the child objects the controller applies for cb, in
// the order it applies them. Owner references carry the CacheBackend's UID
// only when cb has one (a live object); offline it is empty.
func RenderYAML(w io.Writer, cb *v1alpha1.CacheBackend) error {
	objs, err := render.Objects(render.Render(cb))
	if err != nil {
		return err
	}
	if len(objs) == 0 {
		_, err := fmt.Fprintf(w, "# CacheBackend %s/%s (type %s) runs no server: no child objects\n", cb.Namespace, cb.Name, cb.Spec.Type)
		return err
	}
	for _, o := range objs {
		out, err := yaml.Marshal(o.Object)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "---\n%s", out); err != nil {
			return err
		}
	}
	return nil
}

// WireEngine previews the webhook on an engine Deployment: its pod template
// as the webhook would wire a pod of it for cb, with the endpoint the
// Service name implies. It returns the Deployment with the wired template
// and the webhook's decision.
func WireEngine(cb *v1alpha1.CacheBackend, engine *appsv1.Deployment) (*appsv1.Deployment, inject.Decision) {
	return WireEngineWith(cb, engine, inject.Options{})
}

// WireEngineWith is WireEngine with the manager's injection options, e.g.
// KVEventSubscriberImage and IndexEndpoint to preview the
// kvevent-subscriber sidecar wiring.
func WireEngineWith(cb *v1alpha1.CacheBackend, engine *appsv1.Deployment, opts inject.Options) (*appsv1.Deployment, inject.Decision) {
	b := cb.DeepCopy()
	if b.Spec.Type == v1alpha1.BackendTypeLMCache {
		b.Status.Endpoint = render.Endpoint(b, opts.ClusterDomain)
	}
	pod := &corev1.Pod{ObjectMeta: *engine.Spec.Template.ObjectMeta.DeepCopy(), Spec: *engine.Spec.Template.Spec.DeepCopy()}
	pod.Namespace = engine.Namespace
	d := inject.Decide(pod, []v1alpha1.CacheBackend{*b}, opts)
	out := engine.DeepCopy()
	out.Spec.Template.Spec = d.Pod.Spec
	// Receipts are stamped on each pod, not on its template.
	for _, k := range []string{v1alpha1.AnnotationInjectSkipped, v1alpha1.AnnotationKVEventsSkipped} {
		if v := d.Pod.Annotations[k]; v != "" {
			if out.Spec.Template.Annotations == nil {
				out.Spec.Template.Annotations = map[string]string{}
			}
			out.Spec.Template.Annotations[k] = v
		}
	}
	return out, d
}

// Engines decodes the Deployments among objs.
func Engines(objs []*unstructured.Unstructured) ([]*appsv1.Deployment, error) {
	var out []*appsv1.Deployment
	for _, o := range objs {
		if o.GetKind() != "Deployment" {
			continue
		}
		raw, err := o.MarshalJSON()
		if err != nil {
			return nil, err
		}
		d := &appsv1.Deployment{}
		if err := yaml.UnmarshalStrict(raw, d); err != nil {
			return nil, fmt.Errorf("decoding Deployment %s: %w", o.GetName(), err)
		}
		if d.Namespace == "" {
			d.Namespace = "default"
		}
		out = append(out, d)
	}
	if len(out) == 0 {
		return nil, errors.New("no Deployment in the engine input")
	}
	return out, nil
}
