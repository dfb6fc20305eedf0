// Package manifests builds the project's kustomizations in process with
// sigs.k8s.io/kustomize/api (krusty), for tests that need the exact objects
// the install bundle ships.
package manifests

import (
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/inferencecache/operator/internal/cli"
)

// Build runs kustomize on dir, as the CLI does, and returns its objects.
func Build(dir string) ([]*unstructured.Unstructured, error) {
	return cli.ReadFile(dir, true)
}

// Webhooks returns the webhook configurations of the kustomization in dir.
func Webhooks(dir string) ([]*admissionregistrationv1.MutatingWebhookConfiguration, []*admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	objs, err := Build(dir)
	if err != nil {
		return nil, nil, err
	}
	var m []*admissionregistrationv1.MutatingWebhookConfiguration
	var v []*admissionregistrationv1.ValidatingWebhookConfiguration
	for _, o := range objs {
		switch o.GetKind() {
		case "MutatingWebhookConfiguration":
			c := &admissionregistrationv1.MutatingWebhookConfiguration{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, c); err != nil {
				return nil, nil, err
			}
			m = append(m, c)
		case "ValidatingWebhookConfiguration":
			c := &admissionregistrationv1.ValidatingWebhookConfiguration{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, c); err != nil {
				return nil, nil, err
			}
			v = append(v, c)
		}
	}
	return m, v, nil
}

// ManagerMemoryLimit returns the memory limit of the manager container of
// the kustomization in dir (the install bundle's limits.memory), in bytes.
func ManagerMemoryLimit(dir string) (int64, error) {
	objs, err := Build(dir)
	if err != nil {
		return 0, err
	}
	for _, o := range objs {
		if o.GetKind() != "Deployment" {
			continue
		}
		d := &appsv1.Deployment{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, d); err != nil {
			return 0, err
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok && c.Name == "manager" {
				return q.Value(), nil
			}
		}
	}
	return 0, fmt.Errorf("no manager container with a memory limit in %s", dir)
}
