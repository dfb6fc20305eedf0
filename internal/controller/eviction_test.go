package controller_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/internal/apply"
	"github.com/inferencecache/operator/internal/rollout"
	"github.com/inferencecache/operator/test/integration/suite"
	"github.com/inferencecache/operator/test/testutil"
)

// TestEvictionIsConditionalOnTheUID: through the real API server, the
// per-node cascade's eviction of a pod whose name now belongs to another
// pod (another UID) evicts nothing and is no error; with the pod's own UID
// it evicts the pod.
func TestEvictionIsConditionalOnTheUID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "engine-0"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}}}
	require.NoError(t, suite.K8s.Create(ctx, pod))
	a := apply.New(suite.K8s)

	done, forbidden, err := apply.Evict(ctx, a, ns, []rollout.Eviction{{Pod: "engine-0", UID: "uid-of-its-predecessor", Node: "gpu-a"}})
	require.NoError(t, err)
	assert.Empty(t, done)
	assert.Empty(t, forbidden)
	require.NoError(t, suite.K8s.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{}), "the pod under that name is left alone")

	done, _, err = apply.Evict(ctx, a, ns, []rollout.Eviction{{Pod: "engine-0", UID: pod.UID, Node: "gpu-a"}})
	require.NoError(t, err)
	assert.Len(t, done, 1)
	testutil.Eventually(t, 15*time.Second, func() error {
		return testutil.Gone(ctx, suite.K8s, client.ObjectKeyFromObject(pod), &corev1.Pod{})
	})
}
