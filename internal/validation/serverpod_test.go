package validation

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// TestServerPod: spec.remoteStorage.lmCacheServer.pod refused where the
// API server would refuse the pod template it becomes, or where it would
// move the server's pods out of their own selector, with the field path.
func TestServerPod(t *testing.T) {
	base := func(p *v1alpha1.ServerPod) *v1alpha1.CacheBackend {
		return &v1alpha1.CacheBackend{
			ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache"},
			Spec: v1alpha1.CacheBackendSpec{Runtime: v1alpha1.RuntimeVLLM, Type: v1alpha1.BackendTypeLMCache,
				EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "e"}},
				RemoteStorage:  &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Pod: p}}},
		}
	}
	const path = "spec.remoteStorage.lmCacheServer.pod."
	for _, tc := range []struct {
		name  string
		pod   v1alpha1.ServerPod
		field string // "" when admitted
		text  string
	}{
		{"everything well-formed", v1alpha1.ServerPod{
			Labels: map[string]string{"team": "inference"}, Annotations: map[string]string{"a.example/b": "c"},
			NodeSelector: map[string]string{"node-pool": "cpu"}, PriorityClassName: "kv-cache",
			ImagePullSecrets: []v1alpha1.ServerPullSecret{{Name: "regcred"}},
			Tolerations: []v1alpha1.ServerToleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "kv", Effect: corev1.TaintEffectNoSchedule},
				{Operator: corev1.TolerationOpExists}, {Key: "k", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](30)}},
			TopologySpreadConstraints: []v1alpha1.ServerTopologySpread{{MaxSkew: 1, TopologyKey: "topology.kubernetes.io/zone", WhenUnsatisfiable: corev1.ScheduleAnyway}},
			SecurityContext:           &v1alpha1.ServerPodSecurityContext{SeccompProfile: &v1alpha1.ServerSeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
		}, "", ""},
		{"root by its own choice", v1alpha1.ServerPod{SecurityContext: &v1alpha1.ServerPodSecurityContext{RunAsUser: ptr.To[int64](0)}}, "", ""},
		{"root with runAsNonRoot false", v1alpha1.ServerPod{SecurityContext: &v1alpha1.ServerPodSecurityContext{RunAsNonRoot: ptr.To(false), RunAsUser: ptr.To[int64](0)}}, "", ""},
		{"root on the pod while runAsNonRoot", v1alpha1.ServerPod{SecurityContext: &v1alpha1.ServerPodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](0)}},
			path + "securityContext.runAsUser", "user 0 is root while runAsNonRoot is true"},
		{"root on the container while the pod says runAsNonRoot", v1alpha1.ServerPod{SecurityContext: &v1alpha1.ServerPodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](1000)},
			ContainerSecurityContext: &v1alpha1.ServerContainerSecurityContext{RunAsUser: ptr.To[int64](0)}},
			path + "containerSecurityContext.runAsUser", "set runAsNonRoot: false"},
		{"the container's runAsNonRoot false wins over the pod's", v1alpha1.ServerPod{SecurityContext: &v1alpha1.ServerPodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](0)},
			ContainerSecurityContext: &v1alpha1.ServerContainerSecurityContext{RunAsNonRoot: ptr.To(false)}}, "", ""},
		{"a well-formed affinity", v1alpha1.ServerPod{Affinity: goodAffinity()}, "", ""},
		{"a bad node affinity key", v1alpha1.ServerPod{Affinity: nodeAffinity(v1alpha1.ServerNodeSelectorRequirement{Key: "-pool", Operator: corev1.NodeSelectorOpExists})},
			path + "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key", "name part must consist of"},
		{"In without values", v1alpha1.ServerPod{Affinity: nodeAffinity(v1alpha1.ServerNodeSelectorRequirement{Key: "pool", Operator: corev1.NodeSelectorOpIn})},
			path + "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].values", "must be specified when `operator` is 'In' or 'NotIn'"},
		{"Exists with values", v1alpha1.ServerPod{Affinity: nodeAffinity(v1alpha1.ServerNodeSelectorRequirement{Key: "pool", Operator: corev1.NodeSelectorOpExists, Values: []string{"a"}})},
			path + "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].values", "may not be specified"},
		{"Gt with two values", v1alpha1.ServerPod{Affinity: nodeAffinity(v1alpha1.ServerNodeSelectorRequirement{Key: "cpus", Operator: corev1.NodeSelectorOpGt, Values: []string{"1", "2"}})},
			path + "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].values", "single value"},
		{"a preferred term's bad key", v1alpha1.ServerPod{Affinity: &v1alpha1.ServerAffinity{NodeAffinity: &v1alpha1.ServerNodeAffinity{
			PreferredDuringSchedulingIgnoredDuringExecution: []v1alpha1.ServerPreferredSchedulingTerm{{Weight: 1, Preference: v1alpha1.ServerNodeSelectorTerm{
				MatchExpressions: []v1alpha1.ServerNodeSelectorRequirement{{Key: "a/b/c", Operator: corev1.NodeSelectorOpExists}}}}}}}},
			path + "affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].preference.matchExpressions[0].key", "a valid label key must consist of"},
		{"a bad anti-affinity topology key", v1alpha1.ServerPod{Affinity: &v1alpha1.ServerAffinity{PodAntiAffinity: &v1alpha1.ServerPodAntiAffinity{
			PreferredDuringSchedulingIgnoredDuringExecution: []v1alpha1.ServerWeightedPodAffinityTerm{{Weight: 1, PodAffinityTerm: v1alpha1.ServerPodAffinityTerm{TopologyKey: "host name"}}}}}},
			path + "affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm.topologyKey", "name part must consist of"},
		{"a label the selector owns", v1alpha1.ServerPod{Labels: map[string]string{"app.kubernetes.io/component": "x"}},
			path + "labels[app.kubernetes.io/component]", "set by the operator"},
		{"the CacheBackend label", v1alpha1.ServerPod{Labels: map[string]string{"inferencecache.io/cachebackend": "other"}},
			path + "labels[inferencecache.io/cachebackend]", "set by the operator"},
		{"a bad label value", v1alpha1.ServerPod{Labels: map[string]string{"team": "has spaces"}}, path + "labels", "a valid label must be"},
		{"a bad annotation key", v1alpha1.ServerPod{Annotations: map[string]string{"bad key!": "x"}}, path + "annotations", "name part must consist of"},
		{"a bad node selector key", v1alpha1.ServerPod{NodeSelector: map[string]string{"-x": "y"}}, path + "nodeSelector", "name part must consist of"},
		{"a bad priority class", v1alpha1.ServerPod{PriorityClassName: "Kv_Cache"}, path + "priorityClassName", "lowercase RFC 1123 subdomain"},
		{"a bad pull secret name", v1alpha1.ServerPod{ImagePullSecrets: []v1alpha1.ServerPullSecret{{Name: "Reg_Cred"}}}, path + "imagePullSecrets[0].name", "lowercase RFC 1123 subdomain"},
		{"Exists with a value", v1alpha1.ServerPod{Tolerations: []v1alpha1.ServerToleration{{Key: "k", Operator: corev1.TolerationOpExists, Value: "v"}}},
			path + "tolerations[0].operator", "value must be empty"},
		{"Equal without a key", v1alpha1.ServerPod{Tolerations: []v1alpha1.ServerToleration{{Operator: corev1.TolerationOpEqual, Value: "v"}}},
			path + "tolerations[0].operator", "operator must be Exists when key is empty"},
		{"tolerationSeconds without NoExecute", v1alpha1.ServerPod{Tolerations: []v1alpha1.ServerToleration{{Key: "k", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule, TolerationSeconds: ptr.To[int64](5)}}},
			path + "tolerations[0].effect", "NoExecute"},
		{"a bad topology key", v1alpha1.ServerPod{TopologySpreadConstraints: []v1alpha1.ServerTopologySpread{{MaxSkew: 1, TopologyKey: "-zone", WhenUnsatisfiable: corev1.DoNotSchedule}}},
			path + "topologySpreadConstraints[0].topologyKey", "name part must consist of"},
		{"a Localhost seccomp profile without its path", v1alpha1.ServerPod{ContainerSecurityContext: &v1alpha1.ServerContainerSecurityContext{SeccompProfile: &v1alpha1.ServerSeccompProfile{Type: corev1.SeccompProfileTypeLocalhost}}},
			path + "containerSecurityContext.seccompProfile.localhostProfile", "Required value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := Validate(base(&tc.pod))
			if tc.field == "" {
				assert.Empty(t, errs)
				return
			}
			found := false
			for _, e := range errs {
				if strings.HasPrefix(e.Field, strings.TrimSuffix(tc.field, ".")) && strings.Contains(e.Error(), tc.text) {
					found = true
				}
			}
			assert.True(t, found, "want %s: %s in %v", tc.field, tc.text, errs)
		})
	}
}

func nodeAffinity(r v1alpha1.ServerNodeSelectorRequirement) *v1alpha1.ServerAffinity {
	return &v1alpha1.ServerAffinity{NodeAffinity: &v1alpha1.ServerNodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &v1alpha1.ServerNodeSelector{
		NodeSelectorTerms: []v1alpha1.ServerNodeSelectorTerm{{MatchExpressions: []v1alpha1.ServerNodeSelectorRequirement{r}}}}}}
}

func goodAffinity() *v1alpha1.ServerAffinity {
	a := nodeAffinity(v1alpha1.ServerNodeSelectorRequirement{Key: "node-pool", Operator: corev1.NodeSelectorOpIn, Values: []string{"cpu"}})
	a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution = []v1alpha1.ServerPreferredSchedulingTerm{{Weight: 100, Preference: v1alpha1.ServerNodeSelectorTerm{
		MatchExpressions: []v1alpha1.ServerNodeSelectorRequirement{{Key: "cpus", Operator: corev1.NodeSelectorOpGt, Values: []string{"8"}}}}}}
	a.PodAntiAffinity = &v1alpha1.ServerPodAntiAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution:  []v1alpha1.ServerPodAffinityTerm{{TopologyKey: "kubernetes.io/hostname"}},
		PreferredDuringSchedulingIgnoredDuringExecution: []v1alpha1.ServerWeightedPodAffinityTerm{{Weight: 10, PodAffinityTerm: v1alpha1.ServerPodAffinityTerm{TopologyKey: "topology.kubernetes.io/zone"}}},
	}
	return a
}
