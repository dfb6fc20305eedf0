package validation_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/inferencecache/operator/test/integration/suite"
)

// TestAPIServerRejectsInvalidCacheBackends: the CRD's schema and CEL rules
// make the API server itself reject bad input, naming the field.
func TestAPIServerRejectsInvalidCacheBackends(t *testing.T) {
	t.Parallel()
	ns := suite.NewNamespace(t)
	cases := []struct {
		name     string
		manifest string
		// wantField and wantText must both appear in the API server's message.
		wantField, wantText string
	}{
		{"unknown runtime", `spec: {type: LMCache, runtime: TensorRT}`,
			"spec.runtime", `Unsupported value: "TensorRT"`},
		{"unknown type", `spec: {type: Redis}`,
			"spec.type", `Unsupported value: "Redis"`},
		{"type missing", `spec: {runtime: VLLM}`,
			"spec.type", "Required value"},
		{"HiCache on vLLM", `spec: {type: SGLangHiCache, runtime: VLLM}`,
			"spec", "type SGLangHiCache requires runtime SGLang"},
		{"LMCache on SGLang", `spec: {type: LMCache, runtime: SGLang}`,
			"spec", "runtime must be VLLM"},
		{"unknown role", `spec: {type: LMCache, integration: {role: Sometimes}}`,
			"spec.integration.role", `Unsupported value: "Sometimes"`},
		{"autoscaling min above max", `spec: {type: LMCache, autoscaling: {minReplicas: 5, maxReplicas: 2}}`,
			"spec.autoscaling", "minReplicas must be less than or equal to maxReplicas"},
		{"autoscaling max missing", `spec: {type: LMCache, autoscaling: {minReplicas: 1}}`,
			"spec.autoscaling.maxReplicas", "Required value"},
		{"port out of range", `spec: {type: LMCache, remoteStorage: {lmCacheServer: {port: 70000}}}`,
			"spec.remoteStorage.lmCacheServer.port", "should be less than or equal to 65535"},
		{"zero replicas", `spec: {type: LMCache, remoteStorage: {lmCacheServer: {replicas: 0}}}`,
			"spec.remoteStorage.lmCacheServer.replicas", "should be greater than or equal to 1"},
		{"unknown provider", `spec: {type: LMCache, remoteStorage: {provider: Redis}}`,
			"spec.remoteStorage.provider", `Unsupported value: "Redis"`},
		{"unknown deployment kind", `spec: {type: LMCache, deploymentKind: DaemonSet}`,
			"spec.deploymentKind", `Unsupported value: "DaemonSet"`},
		{"storage without size", `spec: {type: LMCache, storage: {pvc: {storageClassName: fast}}}`,
			"spec.storage.pvc.size", "Required value"},
		{"storage size zero", `spec: {type: LMCache, storage: {pvc: {size: "0"}}}`,
			"spec.storage.pvc.size", "size must be greater than zero"},
		{"unknown access mode", `spec: {type: LMCache, storage: {pvc: {size: 1Gi, accessModes: [ReadWriteSometimes]}}}`,
			"spec.storage.pvc.accessModes[0]", `Unsupported value: "ReadWriteSometimes"`},
		{"unknown retention", `spec: {type: LMCache, storage: {pvc: {size: 1Gi, retention: {whenDeleted: Archive}}}}`,
			"spec.storage.pvc.retention.whenDeleted", `Unsupported value: "Archive"`},
		{"hiCache on LMCache", `spec: {type: LMCache, hiCache: {pageSize: 64}}`,
			"spec", "hiCache is only valid with type SGLangHiCache"},
		{"HiCache with a server", `spec: {type: SGLangHiCache, runtime: SGLang, remoteStorage: {}}`,
			"spec", "remoteStorage, storage and autoscaling are not allowed"},
		{"HiCache ratio not above 1", `spec: {type: SGLangHiCache, runtime: SGLang, hiCache: {ratio: "0.5"}}`,
			"spec.hiCache.ratio", "ratio must be greater than 1"},
		{"HiCache ratio and size", `spec: {type: SGLangHiCache, runtime: SGLang, hiCache: {ratio: "2", sizeGB: 10}}`,
			"spec.hiCache", "set either ratio or sizeGB"},
		{"local disk path with a comma", `spec: {type: LMCache, lmCache: {localDisk: {path: "/data/a,b", maxSize: 1Gi}}}`,
			"spec.lmCache.localDisk.path", "path must not contain a comma"},
		{"unknown HiCache write policy", `spec: {type: SGLangHiCache, runtime: SGLang, hiCache: {writePolicy: lazy}}`,
			"spec.hiCache.writePolicy", `Unsupported value: "lazy"`},
		{"duplicate override env", `spec: {type: LMCache, integration: {engineOverrides: {env: [{name: A, value: "1"}, {name: A, value: "2"}]}}}`,
			"spec.integration.engineOverrides.env[1]", "Duplicate value"},
		{"unknown field", `spec: {type: LMCache, replicas: 3}`,
			"spec.replicas", "unknown field"},
		{"name not a DNS-1035 label", `metadata: {name: 1cache}
spec: {type: LMCache}`,
			"metadata.name", "must be a DNS-1035 label"},
	}
	require.GreaterOrEqual(t, len(cases), 10)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u := &unstructured.Unstructured{}
			require.NoError(t, yaml.Unmarshal([]byte(tc.manifest), &u.Object))
			u.SetAPIVersion("inferencecache.io/v1alpha1")
			u.SetKind("CacheBackend")
			u.SetNamespace(ns)
			if u.GetName() == "" {
				u.SetName("invalid")
			}
			err := suite.K8s.Create(context.Background(), u, client.DryRunAll, client.FieldValidation("Strict"))
			require.Error(t, err, "the API server accepted an invalid CacheBackend")
			assert.True(t, apierrors.IsInvalid(err) || apierrors.IsBadRequest(err), "rejected as invalid: %v", err)
			assert.Contains(t, err.Error(), tc.wantField, "message names the field")
			assert.Contains(t, err.Error(), tc.wantText)
		})
	}

	t.Run("type is immutable", func(t *testing.T) {
		ctx := context.Background()
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "inferencecache.io/v1alpha1", "kind": "CacheBackend",
			"metadata": map[string]any{"name": "immutable", "namespace": ns},
			"spec":     map[string]any{"type": "LMCache"},
		}}
		require.NoError(t, suite.K8s.Create(ctx, u))
		require.NoError(t, unstructured.SetNestedField(u.Object, "SGLangHiCache", "spec", "type"))
		require.NoError(t, unstructured.SetNestedField(u.Object, "SGLang", "spec", "runtime"))
		err := suite.K8s.Update(ctx, u)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "spec.type")
		assert.True(t, strings.Contains(err.Error(), "type is immutable"), err.Error())
	})
}
