// Package v1alpha1 holds the inferencecache.io/v1alpha1 API: the CacheBackend
// custom resource that wires a shared KV cache into vLLM and SGLang engines.
//
// +kubebuilder:object:generate=true
// +groupName=inferencecache.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "inferencecache.io", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this API with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion} //nolint:staticcheck // kubebuilder's registration helper, which the generated deepcopy code and controller-gen expect

	// AddToScheme adds the types of this API to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
