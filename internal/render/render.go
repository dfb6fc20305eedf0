// Package render turns a CacheBackend into the child objects the operator
// applies for it, as client-go apply configurations. It is pure: no client,
// no clock, no randomness; the same CacheBackend always renders the same
// objects. Each apply configuration holds only the fields the operator means
// to own, so server-side apply never claims a field the API server or another
// manager sets.
package render

import (
	"reflect"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	autoscalingv2ac "k8s.io/client-go/applyconfigurations/autoscaling/v2"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/lmcacheproto"
	"github.com/inferencecache/operator/internal/topology"
	"github.com/inferencecache/operator/internal/version"
	"github.com/inferencecache/operator/internal/workload"
)

// Names and defaults that are part of the operator's contract: they appear
// in child objects users see and select on.
const (
	// LabelCacheBackend carries the owning CacheBackend's name on every child
	// and on the cache-server pods; it is part of the workload selector.
	LabelCacheBackend = "inferencecache.io/cachebackend"
	// LabelComponent is the well-known component label; part of the selector.
	LabelComponent = "app.kubernetes.io/component"
	// ComponentCacheServer is the component value of the cache server.
	ComponentCacheServer = "cache-server"

	labelName       = "app.kubernetes.io/name"
	labelInstance   = "app.kubernetes.io/instance"
	labelManagedBy  = "app.kubernetes.io/managed-by"
	labelPartOf     = "app.kubernetes.io/part-of"
	labelVersion    = "app.kubernetes.io/version"
	partOfValue     = "inferencecache"
	nameLMCache     = "lmcache-server"
	managedByValue  = v1alpha1.ReportingController
	containerName   = "lmcache-server"
	portName        = "lmcache"
	dataMountPath   = "/data"
	defaultHPACPU   = int32(80)
	defaultReplicas = int32(1)

	// DataVolumeName names the data volume and a StatefulSet's
	// volumeClaimTemplate, whose claims are <DataVolumeName>-<name>-<ordinal>.
	DataVolumeName = "cache-data"

	// DefaultImage is the cache-server image when the spec names none.
	// The tag follows the LMCache version the conformance suite runs
	// (test/tools/python/tested-versions.txt;
	// TestDefaultImageIsTheTestedLMCache holds them together, and the CRD
	// default of spec.remoteStorage.lmCacheServer.image).
	DefaultImage = "lmcache/vllm-openai:v0.5.6"
)

// Children is the full set of objects the operator wants for one
// CacheBackend. Nil members are objects it does not want: the applier prunes
// the Service, workload and HPA kinds it finds but does not want (never PVCs).
type Children struct {
	Deployment  *appsv1ac.DeploymentApplyConfiguration
	StatefulSet *appsv1ac.StatefulSetApplyConfiguration
	// DaemonSet is the node-local servers of multiprocess mode.
	DaemonSet *appsv1ac.DaemonSetApplyConfiguration
	Service   *corev1ac.ServiceApplyConfiguration
	HPA       *autoscalingv2ac.HorizontalPodAutoscalerApplyConfiguration
	PVC       *corev1ac.PersistentVolumeClaimApplyConfiguration
}

// HasWorkload reports whether c holds the server workload.
func (c Children) HasWorkload() bool {
	return c.Deployment != nil || c.StatefulSet != nil || c.DaemonSet != nil
}

// WithoutWorkload is c without its server workload (held by the plan).
func (c Children) WithoutWorkload() Children {
	c.Deployment, c.StatefulSet, c.DaemonSet = nil, nil, nil
	return c
}

// WorkloadClaimTemplates are the rendered workload's volumeClaimTemplates
// (none for a kind that mounts a shared claim).
func (c Children) WorkloadClaimTemplates() []corev1ac.PersistentVolumeClaimApplyConfiguration {
	if s := c.StatefulSet; s != nil && s.Spec != nil {
		return s.Spec.VolumeClaimTemplates
	}
	return nil
}

// WorkloadReplicasUnset reports whether the rendered workload leaves
// spec.replicas unset (an autoscaler holds the count).
func (c Children) WorkloadReplicasUnset() bool {
	switch {
	case c.Deployment != nil:
		return c.Deployment.Spec != nil && c.Deployment.Spec.Replicas == nil
	case c.StatefulSet != nil:
		return c.StatefulSet.Spec != nil && c.StatefulSet.Spec.Replicas == nil
	}
	return false
}

// SelectorLabels are the labels that select the cache-server pods of cb. They
// are immutable on a Deployment, so they never change for a given name.
func SelectorLabels(cb *v1alpha1.CacheBackend) map[string]string {
	return map[string]string{
		LabelCacheBackend: cb.Name,
		LabelComponent:    ComponentCacheServer,
	}
}

// Labels are the labels of every child of cb and of its cache-server pods.
func Labels(cb *v1alpha1.CacheBackend) map[string]string {
	l := SelectorLabels(cb)
	l[labelName] = nameLMCache
	l[labelInstance] = cb.Name
	l[labelManagedBy] = managedByValue
	return l
}

// objectLabels are the labels of the children themselves: Labels plus the
// project (part-of) and the operator version that last applied them
// (app.kubernetes.io/version). The version is never put on pod templates
// or claim templates, so that upgrading the operator restarts no cache
// server (and so no engine) and never touches a StatefulSet's immutable
// volumeClaimTemplates.
func objectLabels(cb *v1alpha1.CacheBackend) map[string]string {
	l := Labels(cb)
	l[labelPartOf] = partOfValue
	l[labelVersion] = version.Version
	return l
}

// LabelledFor reports whether labels carry LabelCacheBackend for cb's
// name, as every claim made for a CacheBackend of that name does (by the
// operator, or by the StatefulSet controller from the claim template),
// also one retained after that CacheBackend was deleted.
func LabelledFor(cb *v1alpha1.CacheBackend, labels map[string]string) bool {
	return labels[LabelCacheBackend] == cb.Name
}

// PVCName is the name of the shared PVC of a Deployment-kind backend.
func PVCName(cb *v1alpha1.CacheBackend) string { return cb.Name + "-data" }

// Replicas is the replica count the operator applies to the workload when no
// HPA owns it.
func Replicas(cb *v1alpha1.CacheBackend) int32 {
	if s := server(cb); s != nil && s.Replicas != nil {
		return *s.Replicas
	}
	return defaultReplicas
}

// Options are what a render takes from the cluster besides the
// CacheBackend: the zero value renders the children of a new server.
type Options struct {
	// LegacyPod renders the server's pod template without the hardened
	// defaults (ServerPodDefaults): for a live workload that lacks
	// AnnotationServerPodDefaults, created by an operator before them. Its
	// template then renders exactly as that operator rendered it, so that
	// upgrading the operator restarts no cache server.
	LegacyPod bool
}

// OptionsFor are the Options of a render against live, the server
// workload as read (nil when there is none yet).
func OptionsFor(live metav1.Object) Options {
	if live == nil || reflect.ValueOf(live).IsNil() {
		return Options{}
	}
	return Options{LegacyPod: live.GetAnnotations()[v1alpha1.AnnotationServerPodDefaults] != v1alpha1.ServerPodDefaultsRestricted}
}

// Render returns the children cb wants for a new server (Options{}).
func Render(cb *v1alpha1.CacheBackend) Children { return RenderWith(cb, Options{}) }

// RenderWith returns the children cb wants. A CacheBackend that runs no
// server (type SGLangHiCache) wants none. The schema admits only the values
// render implements (one provider, one ownership), so any admitted spec
// renders.
func RenderWith(cb *v1alpha1.CacheBackend, o Options) Children {
	if cb.Spec.Type != v1alpha1.BackendTypeLMCache {
		return Children{}
	}
	if topology.Of(cb) == topology.Multiprocess {
		s := MPServerFor(cb)
		return Children{Service: MPService(cb, s), DaemonSet: MPDaemonSet(cb, s)}
	}
	c := Children{Service: service(cb)}
	if IsStatefulSet(cb) {
		c.StatefulSet = statefulSet(cb, o)
	} else {
		c.Deployment = deployment(cb, o)
		if pvcSpec(cb) != nil {
			c.PVC = pvc(cb)
		}
	}
	if cb.Spec.Autoscaling != nil {
		c.HPA = hpa(cb)
	}
	return c
}

// IsStatefulSet reports whether cb's server runs as a StatefulSet.
func IsStatefulSet(cb *v1alpha1.CacheBackend) bool {
	return WorkloadKind(cb) == string(v1alpha1.DeploymentKindStatefulSet)
}

// WorkloadKind is the kind of cb's server workload, as internal/workload
// (the one place that decides it) chooses it from the spec.
func WorkloadKind(cb *v1alpha1.CacheBackend) string {
	return workload.For(cb).Kind()
}

func server(cb *v1alpha1.CacheBackend) *v1alpha1.LMCacheServer {
	if cb.Spec.RemoteStorage == nil {
		return nil
	}
	return cb.Spec.RemoteStorage.LMCacheServer
}

func pvcSpec(cb *v1alpha1.CacheBackend) *v1alpha1.PVCStorage {
	if cb.Spec.Storage == nil {
		return nil
	}
	return cb.Spec.Storage.PVC
}

func ownerRef(cb *v1alpha1.CacheBackend) *metav1ac.OwnerReferenceApplyConfiguration {
	return metav1ac.OwnerReference().
		WithAPIVersion(v1alpha1.GroupVersion.String()).
		WithKind("CacheBackend").
		WithName(cb.Name).
		WithUID(cb.UID).
		WithController(true).
		WithBlockOwnerDeletion(true)
}

func deployment(cb *v1alpha1.CacheBackend, o Options) *appsv1ac.DeploymentApplyConfiguration {
	spec := appsv1ac.DeploymentSpec().
		WithSelector(metav1ac.LabelSelector().WithMatchLabels(SelectorLabels(cb))).
		WithTemplate(podTemplate(cb, o))
	// With an HPA the replica count belongs to the HPA: leaving it out here
	// keeps the operator from fighting the autoscaler over the field.
	if cb.Spec.Autoscaling == nil {
		spec.WithReplicas(Replicas(cb))
	}
	spec.WithStrategy(strategy(cb))
	d := appsv1ac.Deployment(cb.Name, cb.Namespace).
		WithLabels(objectLabels(cb)).
		WithOwnerReferences(ownerRef(cb)).
		WithSpec(spec)
	if a := workloadAnnotations(o); a != nil {
		d.WithAnnotations(a)
	}
	return d
}

// strategy is always rendered in full, so that switching between the two
// types never leaves a defaulted rollingUpdate block behind that the API
// server would reject next to type Recreate. A ReadWriteOnce claim can be
// attached by one node only, so a Deployment with one recreates its pod;
// otherwise a surge pod comes up before the old one goes, keeping the
// endpoint served through a rollout.
func strategy(cb *v1alpha1.CacheBackend) *appsv1ac.DeploymentStrategyApplyConfiguration {
	if p := pvcSpec(cb); p != nil && !hasAccessMode(p, corev1.ReadWriteMany) {
		return appsv1ac.DeploymentStrategy().WithType(appsv1.RecreateDeploymentStrategyType)
	}
	return appsv1ac.DeploymentStrategy().
		WithType(appsv1.RollingUpdateDeploymentStrategyType).
		WithRollingUpdate(appsv1ac.RollingUpdateDeployment().
			WithMaxUnavailable(intstr.FromInt32(0)).
			WithMaxSurge(intstr.FromInt32(1)))
}

// workloadAnnotations are the annotations of a workload of every kind:
// the mark of the hardened pod defaults (AnnotationServerPodDefaults) when
// its template has them, none otherwise. A workload rendered with
// Options{} reads back through OptionsFor as Options{}
// (TestRenderedWorkloadsReadBackAsRendered).
func workloadAnnotations(o Options) map[string]string {
	if o.LegacyPod {
		return nil
	}
	return map[string]string{v1alpha1.AnnotationServerPodDefaults: v1alpha1.ServerPodDefaultsRestricted}
}

func podTemplate(cb *v1alpha1.CacheBackend, o Options) *corev1ac.PodTemplateSpecApplyConfiguration {
	port := topology.Port(cb)
	image := ServerImage(cb)
	var resources *corev1.ResourceRequirements
	if s := server(cb); s != nil {
		resources = s.Resources
	}
	p := serverPod(cb)
	if !o.LegacyPod {
		p = ServerPodDefaults(p)
		if resources == nil {
			resources = DefaultResources()
		}
	}
	container := corev1ac.Container().
		WithName(containerName).
		WithImage(image).
		WithCommand(ServerCommand).
		WithArgs(ServerArgs(cb)...).
		WithPorts(corev1ac.ContainerPort().
			WithName(portName).
			WithContainerPort(port).
			WithProtocol(corev1.ProtocolTCP)).
		WithReadinessProbe(probe(cb, 0, 10, 3)).
		WithLivenessProbe(probe(cb, 15, 20, 3))
	if resources != nil {
		rr := corev1ac.ResourceRequirements()
		if len(resources.Requests) > 0 {
			rr.WithRequests(resources.Requests)
		}
		if len(resources.Limits) > 0 {
			rr.WithLimits(resources.Limits)
		}
		container.WithResources(rr)
	}
	podSpec := corev1ac.PodSpec()
	if pvcSpec(cb) != nil {
		// The claim is mounted at /data and kept as the retention says,
		// but lmcache_server 0.5 keeps KV in memory only (ServerDevice)
		// and writes nothing there.
		container.WithVolumeMounts(corev1ac.VolumeMount().WithName(DataVolumeName).WithMountPath(dataMountPath))
		// A kind with claims per replica (StatefulSet) gets the volume from
		// its volumeClaimTemplate of the same name; the others mount the
		// shared claim.
		if !workload.For(cb).ClaimsPerReplica() {
			podSpec.WithVolumes(corev1ac.Volume().
				WithName(DataVolumeName).
				WithPersistentVolumeClaim(corev1ac.PersistentVolumeClaimVolumeSource().WithClaimName(PVCName(cb))))
		}
	}
	if !o.LegacyPod {
		scratch(podSpec, container)
	}
	return serverTemplate(cb, p, podSpec, container)
}

// serverTemplate is the template of a server pod: podSpec with container,
// p's placement and hardening (nil: none) and cb's labels with p's.
func serverTemplate(cb *v1alpha1.CacheBackend, p *v1alpha1.ServerPod, podSpec *corev1ac.PodSpecApplyConfiguration, container *corev1ac.ContainerApplyConfiguration) *corev1ac.PodTemplateSpecApplyConfiguration {
	labels := Labels(cb)
	var annotations map[string]string
	if p != nil {
		applyServerPod(cb, p, podSpec, container)
		for k, v := range p.Labels {
			if _, owned := labels[k]; !owned { // the webhook refuses them; never let one move a selector
				labels[k] = v
			}
		}
		annotations = p.Annotations
	}
	podSpec.WithContainers(container)
	tmpl := corev1ac.PodTemplateSpec().
		WithLabels(labels).
		WithSpec(podSpec)
	if len(annotations) > 0 {
		tmpl.WithAnnotations(annotations)
	}
	return tmpl
}

func serverPod(cb *v1alpha1.CacheBackend) *v1alpha1.ServerPod {
	if s := server(cb); s != nil {
		return s.Pod
	}
	return nil
}

// applyServerPod puts spec.remoteStorage.lmCacheServer.pod's scheduling,
// pull secrets and security contexts into the pod template; each field
// only when set, so that a CacheBackend without them renders as before.
func applyServerPod(cb *v1alpha1.CacheBackend, p *v1alpha1.ServerPod, spec *corev1ac.PodSpecApplyConfiguration, c *corev1ac.ContainerApplyConfiguration) {
	if len(p.NodeSelector) > 0 {
		spec.WithNodeSelector(p.NodeSelector)
	}
	for _, t := range p.Tolerations {
		tol := corev1ac.Toleration()
		if t.Key != "" {
			tol.WithKey(t.Key)
		}
		if t.Operator != "" {
			tol.WithOperator(t.Operator)
		}
		if t.Value != "" {
			tol.WithValue(t.Value)
		}
		if t.Effect != "" {
			tol.WithEffect(t.Effect)
		}
		if t.TolerationSeconds != nil {
			tol.WithTolerationSeconds(*t.TolerationSeconds)
		}
		spec.WithTolerations(tol)
	}
	for _, t := range p.TopologySpreadConstraints {
		tsc := corev1ac.TopologySpreadConstraint().
			WithMaxSkew(t.MaxSkew).
			WithTopologyKey(t.TopologyKey).
			WithWhenUnsatisfiable(t.WhenUnsatisfiable).
			WithLabelSelector(metav1ac.LabelSelector().WithMatchLabels(SelectorLabels(cb)))
		if t.MinDomains != nil {
			tsc.WithMinDomains(*t.MinDomains)
		}
		spec.WithTopologySpreadConstraints(tsc)
	}
	if p.Affinity != nil {
		spec.WithAffinity(affinity(cb, p.Affinity))
	}
	if p.PriorityClassName != "" {
		spec.WithPriorityClassName(p.PriorityClassName)
	}
	for _, s := range p.ImagePullSecrets {
		spec.WithImagePullSecrets(corev1ac.LocalObjectReference().WithName(s.Name))
	}
	if sc := p.SecurityContext; sc != nil {
		psc := corev1ac.PodSecurityContext()
		if sc.RunAsNonRoot != nil {
			psc.WithRunAsNonRoot(*sc.RunAsNonRoot)
		}
		if sc.RunAsUser != nil {
			psc.WithRunAsUser(*sc.RunAsUser)
		}
		if sc.RunAsGroup != nil {
			psc.WithRunAsGroup(*sc.RunAsGroup)
		}
		if sc.FSGroup != nil {
			psc.WithFSGroup(*sc.FSGroup)
		}
		if sc.SeccompProfile != nil {
			psc.WithSeccompProfile(seccomp(sc.SeccompProfile))
		}
		spec.WithSecurityContext(psc)
	}
	if sc := p.ContainerSecurityContext; sc != nil {
		csc := corev1ac.SecurityContext()
		if sc.AllowPrivilegeEscalation != nil {
			csc.WithAllowPrivilegeEscalation(*sc.AllowPrivilegeEscalation)
		}
		if sc.ReadOnlyRootFilesystem != nil {
			csc.WithReadOnlyRootFilesystem(*sc.ReadOnlyRootFilesystem)
		}
		if sc.RunAsNonRoot != nil {
			csc.WithRunAsNonRoot(*sc.RunAsNonRoot)
		}
		if sc.RunAsUser != nil {
			csc.WithRunAsUser(*sc.RunAsUser)
		}
		if sc.Capabilities != nil && len(sc.Capabilities.Drop) > 0 {
			caps := corev1ac.Capabilities()
			for _, d := range sc.Capabilities.Drop {
				caps.WithDrop(corev1.Capability(d))
			}
			csc.WithCapabilities(caps)
		}
		if sc.SeccompProfile != nil {
			csc.WithSeccompProfile(seccomp(sc.SeccompProfile))
		}
		c.WithSecurityContext(csc)
	}
}

// affinity is a's node affinity as it is, and its pod anti-affinity over
// the server's own pods (SelectorLabels).
func affinity(cb *v1alpha1.CacheBackend, a *v1alpha1.ServerAffinity) *corev1ac.AffinityApplyConfiguration {
	out := corev1ac.Affinity()
	if na := a.NodeAffinity; na != nil {
		nac := corev1ac.NodeAffinity()
		if r := na.RequiredDuringSchedulingIgnoredDuringExecution; r != nil {
			sel := corev1ac.NodeSelector()
			for _, t := range r.NodeSelectorTerms {
				sel.WithNodeSelectorTerms(nodeSelectorTerm(t))
			}
			nac.WithRequiredDuringSchedulingIgnoredDuringExecution(sel)
		}
		for _, p := range na.PreferredDuringSchedulingIgnoredDuringExecution {
			nac.WithPreferredDuringSchedulingIgnoredDuringExecution(corev1ac.PreferredSchedulingTerm().
				WithWeight(p.Weight).WithPreference(nodeSelectorTerm(p.Preference)))
		}
		out.WithNodeAffinity(nac)
	}
	if pa := a.PodAntiAffinity; pa != nil {
		term := func(t v1alpha1.ServerPodAffinityTerm) *corev1ac.PodAffinityTermApplyConfiguration {
			return corev1ac.PodAffinityTerm().
				WithLabelSelector(metav1ac.LabelSelector().WithMatchLabels(SelectorLabels(cb))).
				WithTopologyKey(t.TopologyKey)
		}
		pac := corev1ac.PodAntiAffinity()
		for _, t := range pa.RequiredDuringSchedulingIgnoredDuringExecution {
			pac.WithRequiredDuringSchedulingIgnoredDuringExecution(term(t))
		}
		for _, w := range pa.PreferredDuringSchedulingIgnoredDuringExecution {
			pac.WithPreferredDuringSchedulingIgnoredDuringExecution(corev1ac.WeightedPodAffinityTerm().
				WithWeight(w.Weight).WithPodAffinityTerm(term(w.PodAffinityTerm)))
		}
		out.WithPodAntiAffinity(pac)
	}
	return out
}

func nodeSelectorTerm(t v1alpha1.ServerNodeSelectorTerm) *corev1ac.NodeSelectorTermApplyConfiguration {
	out := corev1ac.NodeSelectorTerm()
	for _, e := range t.MatchExpressions {
		r := corev1ac.NodeSelectorRequirement().WithKey(e.Key).WithOperator(e.Operator)
		if len(e.Values) > 0 {
			r.WithValues(e.Values...)
		}
		out.WithMatchExpressions(r)
	}
	return out
}

func seccomp(p *v1alpha1.ServerSeccompProfile) *corev1ac.SeccompProfileApplyConfiguration {
	sp := corev1ac.SeccompProfile().WithType(p.Type)
	if p.LocalhostProfile != "" {
		sp.WithLocalhostProfile(p.LocalhostProfile)
	}
	return sp
}

// ServerCommand is the cache-server container's command, LMCache's
// lmcache_server console script (lmcache.v1.server.__main__:main).
const ServerCommand = "lmcache_server"

// ServerDevice is the storage device argument of lmcache_server: "cpu",
// the only one its storage backend accepts in LMCache 0.5
// (lmcache/v1/server/storage_backend CreateStorageBackend raises
// "Unsupported device" on anything else). The server keeps KV in memory
// only: with spec.storage.pvc the claim is mounted at /data, but the server
// does not write it.
const ServerDevice = "cpu"

// ServerArgs are the arguments of ServerCommand: `<host> <port> <device>`,
// exactly what lmcache_server takes (it exits on any other argument count,
// so spec.remoteStorage.lmCacheServer.extraArgs is refused at admission and
// never rendered).
func ServerArgs(cb *v1alpha1.CacheBackend) []string {
	return []string{"0.0.0.0", strconv.Itoa(int(topology.Port(cb))), ServerDevice}
}

// ProbeCommand is the exec command of the server container's readiness
// and liveness probes: the image's own python3 sends LMCache's HEALTH
// request to 127.0.0.1:<port> and exits 0 only on code 200, the exchange
// the controller's functional probe makes (lmcacheproto). The port is the
// last argument.
func ProbeCommand(cb *v1alpha1.CacheBackend) []string {
	return []string{"python3", "-c", lmcacheproto.ProbeScript(), strconv.Itoa(int(topology.Port(cb)))}
}

// probeTimeoutSeconds is the container probes' timeout: a Python start and
// the exchange, above the script's own socket timeout.
const probeTimeoutSeconds = lmcacheproto.ProbeTimeoutSeconds + 2

func probe(cb *v1alpha1.CacheBackend, initialDelay, period, failures int32) *corev1ac.ProbeApplyConfiguration {
	p := corev1ac.Probe().
		WithExec(corev1ac.ExecAction().WithCommand(ProbeCommand(cb)...)).
		WithTimeoutSeconds(probeTimeoutSeconds).
		WithPeriodSeconds(period).
		WithFailureThreshold(failures)
	if initialDelay > 0 {
		// A zero would be applied but never stored (omitempty).
		p.WithInitialDelaySeconds(initialDelay)
	}
	return p
}

func service(cb *v1alpha1.CacheBackend) *corev1ac.ServiceApplyConfiguration {
	return corev1ac.Service(topology.ServiceName(cb), cb.Namespace).
		WithLabels(objectLabels(cb)).
		WithOwnerReferences(ownerRef(cb)).
		WithSpec(corev1ac.ServiceSpec().
			WithType(corev1.ServiceTypeClusterIP).
			WithSelector(SelectorLabels(cb)).
			WithPorts(corev1ac.ServicePort().
				WithName(portName).
				WithPort(topology.Port(cb)).
				WithTargetPort(intstr.FromString(portName)).
				WithProtocol(corev1.ProtocolTCP)))
}

func hpa(cb *v1alpha1.CacheBackend) *autoscalingv2ac.HorizontalPodAutoscalerApplyConfiguration {
	as := cb.Spec.Autoscaling
	min := int32(1)
	if as.MinReplicas != nil {
		min = *as.MinReplicas
	}
	metric := func(name corev1.ResourceName, pct int32) *autoscalingv2ac.MetricSpecApplyConfiguration {
		return autoscalingv2ac.MetricSpec().
			WithType("Resource").
			WithResource(autoscalingv2ac.ResourceMetricSource().
				WithName(name).
				WithTarget(autoscalingv2ac.MetricTarget().
					WithType("Utilization").
					WithAverageUtilization(pct)))
	}
	var metrics []*autoscalingv2ac.MetricSpecApplyConfiguration
	if as.TargetCPUUtilizationPercentage != nil {
		metrics = append(metrics, metric(corev1.ResourceCPU, *as.TargetCPUUtilizationPercentage))
	}
	if as.TargetMemoryUtilizationPercentage != nil {
		metrics = append(metrics, metric(corev1.ResourceMemory, *as.TargetMemoryUtilizationPercentage))
	}
	if len(metrics) == 0 {
		metrics = append(metrics, metric(corev1.ResourceCPU, defaultHPACPU))
	}
	return autoscalingv2ac.HorizontalPodAutoscaler(cb.Name, cb.Namespace).
		WithLabels(objectLabels(cb)).
		WithOwnerReferences(ownerRef(cb)).
		WithSpec(autoscalingv2ac.HorizontalPodAutoscalerSpec().
			WithScaleTargetRef(autoscalingv2ac.CrossVersionObjectReference().
				WithAPIVersion("apps/v1").
				WithKind(WorkloadKind(cb)).
				WithName(cb.Name)).
			WithMinReplicas(min).
			WithMaxReplicas(as.MaxReplicas).
			WithMetrics(metrics...))
}

// statefulSet renders the StatefulSet kind: per-replica claims from a
// volumeClaimTemplate when storage is set, and a claim retention policy that
// is always set from spec.storage.pvc.retention (Retain/Retain by default),
// so that a policy edited by hand or missing is put back.
func statefulSet(cb *v1alpha1.CacheBackend, o Options) *appsv1ac.StatefulSetApplyConfiguration {
	spec := appsv1ac.StatefulSetSpec().
		WithServiceName(topology.ServiceName(cb)).
		WithSelector(metav1ac.LabelSelector().WithMatchLabels(SelectorLabels(cb))).
		WithTemplate(podTemplate(cb, o)).
		WithPersistentVolumeClaimRetentionPolicy(appsv1ac.StatefulSetPersistentVolumeClaimRetentionPolicy().
			WithWhenDeleted(retentionPolicyType(cb, func(r *v1alpha1.PVCRetention) v1alpha1.RetentionAction { return r.WhenDeleted })).
			WithWhenScaled(retentionPolicyType(cb, func(r *v1alpha1.PVCRetention) v1alpha1.RetentionAction { return r.WhenScaled })))
	if cb.Spec.Autoscaling == nil {
		spec.WithReplicas(Replicas(cb))
	}
	if t := VolumeClaimTemplate(cb); t != nil {
		spec.WithVolumeClaimTemplates(t)
	}
	s := appsv1ac.StatefulSet(cb.Name, cb.Namespace).
		WithLabels(objectLabels(cb)).
		WithOwnerReferences(ownerRef(cb)).
		WithSpec(spec)
	if a := workloadAnnotations(o); a != nil {
		s.WithAnnotations(a)
	}
	return s
}

func retentionPolicyType(cb *v1alpha1.CacheBackend, get func(*v1alpha1.PVCRetention) v1alpha1.RetentionAction) appsv1.PersistentVolumeClaimRetentionPolicyType {
	if p := pvcSpec(cb); p != nil && p.Retention != nil && get(p.Retention) == v1alpha1.RetentionDelete {
		return appsv1.DeletePersistentVolumeClaimRetentionPolicyType
	}
	return appsv1.RetainPersistentVolumeClaimRetentionPolicyType
}

// VolumeClaimTemplate is the StatefulSet's claim template, nil without
// storage. Its fields are the ones the operator compares with the live
// StatefulSet: name, access modes, storage request, storage class.
func VolumeClaimTemplate(cb *v1alpha1.CacheBackend) *corev1ac.PersistentVolumeClaimApplyConfiguration {
	p := pvcSpec(cb)
	if p == nil {
		return nil
	}
	t := &corev1ac.PersistentVolumeClaimApplyConfiguration{}
	t.WithName(DataVolumeName).
		WithLabels(Labels(cb)).
		WithSpec(claimSpec(p))
	return t
}

func claimSpec(p *v1alpha1.PVCStorage) *corev1ac.PersistentVolumeClaimSpecApplyConfiguration {
	modes := p.AccessModes
	if len(modes) == 0 {
		modes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	}
	spec := corev1ac.PersistentVolumeClaimSpec().
		WithAccessModes(modes...).
		WithResources(corev1ac.VolumeResourceRequirements().
			WithRequests(corev1.ResourceList{corev1.ResourceStorage: p.Size}))
	if p.StorageClassName != nil {
		spec.WithStorageClassName(*p.StorageClassName)
	}
	return spec
}

// pvc renders the shared claim. Whether it is deleted with the CacheBackend
// is expressed only through its owner reference: with retention
// whenDeleted=Delete it is owned by the CacheBackend and garbage-collected
// with it; otherwise it has no owner and outlives it. The operator itself
// never deletes a claim.
func pvc(cb *v1alpha1.CacheBackend) *corev1ac.PersistentVolumeClaimApplyConfiguration {
	spec := claimSpec(pvcSpec(cb))
	retention := v1alpha1.RetentionRetain
	if DeleteDataWithBackend(cb) {
		retention = v1alpha1.RetentionDelete
	}
	// The annotation shows the retention on the claim itself, and makes a
	// retention change a visible difference to the applier, which compares
	// labels, annotations and spec but not owner references.
	claim := corev1ac.PersistentVolumeClaim(PVCName(cb), cb.Namespace).
		WithLabels(objectLabels(cb)).
		WithAnnotations(map[string]string{v1alpha1.AnnotationRetentionWhenDeleted: string(retention)}).
		WithSpec(spec)
	if DeleteDataWithBackend(cb) {
		claim.WithOwnerReferences(ownerRef(cb))
	}
	return claim
}

// DeleteDataWithBackend reports whether cb's claims go when cb is deleted.
func DeleteDataWithBackend(cb *v1alpha1.CacheBackend) bool {
	p := pvcSpec(cb)
	return p != nil && p.Retention != nil && p.Retention.WhenDeleted == v1alpha1.RetentionDelete
}

func hasAccessMode(p *v1alpha1.PVCStorage, m corev1.PersistentVolumeAccessMode) bool {
	for _, have := range p.AccessModes {
		if have == m {
			return true
		}
	}
	return false
}

// ServerImage is the cache server's image: spec.remoteStorage.lmCacheServer.image,
// else DefaultImage.
func ServerImage(cb *v1alpha1.CacheBackend) string {
	if s := server(cb); s != nil && s.Image != "" {
		return s.Image
	}
	return DefaultImage
}
