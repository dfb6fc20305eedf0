// Package cli implements kubectl-cachebackend, the operator's command line:
// previews built from the same packages as the controller and the webhook
// (render, inject), and explanations of live pods. It writes nothing to a
// cluster.
package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/cli-runtime/pkg/resource"
	sigsjson "sigs.k8s.io/json"

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
	"github.com/inferencecache/operator/internal/topology"
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

// ReadSources reads the objects of files and folders (recursive: their
// subfolders too) as kubectl apply -f does, with cli-runtime's resource
// builder; "-" reads in (standard input). Every document of every file is
// returned in order.
func ReadSources(paths []string, recursive bool, in io.Reader) ([]*unstructured.Unstructured, error) {
	b := resource.NewLocalBuilder().Unstructured()
	var files []string
	for _, p := range paths {
		if p == "-" {
			if in == nil {
				return nil, errors.New("-f -: no standard input")
			}
			b = b.Stream(in, "STDIN")
			continue
		}
		files = append(files, p)
	}
	if len(files) > 0 {
		b = b.FilenameParam(false, &resource.FilenameOptions{Filenames: files, Recursive: recursive})
	}
	infos, err := b.Flatten().Do().Infos()
	if err != nil {
		return nil, err
	}
	out := make([]*unstructured.Unstructured, 0, len(infos))
	for _, i := range infos {
		u, ok := i.Object.(*unstructured.Unstructured)
		if !ok {
			return nil, fmt.Errorf("%s: not an object", i.Source)
		}
		out = append(out, u)
	}
	return out, nil
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

// Backends decodes the CacheBackends among objs and checks each as the API
// server would on create, offline: an unknown field is an error naming
// its path; then the CRD's own schema (its defaults applied, types, enums,
// bounds, patterns and CEL rules: SchemaErrors) and then the validating
// webhook's own code (validation.Validate), each refusal in the message
// the API server or the webhook returns (CacheBackend.inferencecache.io
// "<name>" is invalid: ...). It is an error when there is none.
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
		// sigs.k8s.io/json, as the API server decodes: an unknown or
		// duplicate field is named by its path (spec.integration.rol).
		strict, err := sigsjson.UnmarshalStrict(raw, &v1alpha1.CacheBackend{}, sigsjson.DisallowUnknownFields)
		if err != nil {
			return nil, fmt.Errorf("CacheBackend %s: %w", o.GetName(), err)
		}
		if len(strict) > 0 {
			msgs := make([]string, 0, len(strict))
			for _, e := range strict {
				msgs = append(msgs, e.Error())
			}
			return nil, fmt.Errorf("CacheBackend %s: %s", o.GetName(), strings.Join(msgs, "; "))
		}
		defaulted := o.DeepCopy()
		if defaulted.GetNamespace() == "" {
			defaulted.SetNamespace("default")
		}
		errs, err := SchemaErrors(context.Background(), defaulted)
		if err != nil {
			return nil, err
		}
		if len(errs) > 0 {
			return nil, invalid(defaulted.GetName(), errs)
		}
		raw, err = defaulted.MarshalJSON()
		if err != nil {
			return nil, err
		}
		cb := &v1alpha1.CacheBackend{}
		if err := json.Unmarshal(raw, cb); err != nil {
			return nil, fmt.Errorf("CacheBackend %s: %w", o.GetName(), err)
		}
		if err := Check(cb); err != nil {
			return nil, err
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

// Check applies the validating webhook's own rules (validation.Validate)
// to a CacheBackend the schema admits, and returns the webhook's refusal,
// word for word.
func Check(cb *v1alpha1.CacheBackend) error {
	if errs := validation.Validate(cb); len(errs) > 0 {
		return invalid(cb.Name, errs)
	}
	return nil
}

// invalid is the API server's and the webhook's refusal of a CacheBackend.
func invalid(name string, errs field.ErrorList) error {
	return apierrors.NewInvalid(v1alpha1.GroupVersion.WithKind("CacheBackend").GroupKind(), name, errs)
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
		b.Status.Endpoint = topology.Endpoint(b, opts.ClusterDomain)
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
