package cli

import (
	"context"
	"fmt"
	"sync"

	apiextensionsinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/kustomize/base/crd"
)

// crdSchema is the CRD's v1alpha1 schema, as the API server builds it:
// the OpenAPI validator, the structural schema for defaults and the CEL
// rules.
type crdSchema struct {
	validator  apiservervalidation.SchemaValidator
	structural *structuralschema.Structural
	cel        *cel.Validator
}

var loadSchema = sync.OnceValues(func() (*crdSchema, error) {
	var c apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(crd.CacheBackends, &c); err != nil {
		return nil, fmt.Errorf("the embedded CacheBackend CRD: %w", err)
	}
	for _, v := range c.Spec.Versions {
		if v.Name != v1alpha1.GroupVersion.Version || v.Schema == nil {
			continue
		}
		internal := &apiextensionsinternal.JSONSchemaProps{}
		if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(v.Schema.OpenAPIV3Schema, internal, nil); err != nil {
			return nil, err
		}
		validator, _, err := apiservervalidation.NewSchemaValidator(internal)
		if err != nil {
			return nil, err
		}
		structural, err := structuralschema.NewStructural(internal)
		if err != nil {
			return nil, err
		}
		return &crdSchema{validator: validator, structural: structural, cel: cel.NewValidator(structural, true, celconfig.PerCallLimit)}, nil
	}
	return nil, fmt.Errorf("the embedded CRD has no %s schema", v1alpha1.GroupVersion.Version)
})

// SchemaErrors validates a CacheBackend object as the API server does on
// create, with the CRD's own schema: its defaults applied first, then the
// OpenAPI constraints (types, enums, minimums and maximums, patterns,
// lengths) and the CEL rules, with the API server's messages and field
// paths. The object is defaulted in place.
func SchemaErrors(ctx context.Context, obj *unstructured.Unstructured) (field.ErrorList, error) {
	s, err := loadSchema()
	if err != nil {
		return nil, err
	}
	structuraldefaulting.Default(obj.Object, s.structural)
	errs := apiservervalidation.ValidateCustomResource(nil, obj.Object, s.validator)
	celErrs, _ := s.cel.Validate(ctx, nil, s.structural, obj.Object, nil, celconfig.RuntimeCELCostBudget)
	return append(errs, celErrs...), nil
}
