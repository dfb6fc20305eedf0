// Package inject decides how the mutating Pod webhook wires an engine pod to
// a CacheBackend, and computes the mutation. Decide is pure: the pod being
// created, the CacheBackends of its namespace and the manager's options in,
// an outcome and the pod as it should be admitted out; Admit adds the pod's
// decode and the minimal JSON patch. The package serves nothing: the
// admission handler, its guard, the CacheBackend index and the webhook's
// metrics are internal/webhook/podmutation, a thin shell around Admit that
// never rejects a pod.
package inject

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/internal/topology"
)

// Outcome is what the webhook did with a pod.
type Outcome string

// Outcomes of Decide.
const (
	Injected Outcome = "injected"
	Skipped  Outcome = "skipped"
	FailOpen Outcome = "fail-open"
	NoMatch  Outcome = "no-match"
)

// Options are the manager's settings that shape injection.
type Options struct {
	// KVEventSubscriberImage, when set, adds the kvevent-subscriber sidecar
	// to pods whose CacheBackend has spec.observation.modelID.
	KVEventSubscriberImage string
	// IndexEndpoint is the KV-block index's gRPC address (host:port) the
	// sidecar forwards to (the manager's --kvindex-endpoint); empty runs
	// the sidecar without forwarding and without an index token.
	IndexEndpoint string
	// Key, when set, signs receipts (see package receipt). Without it
	// receipts carry a digest but no signature and never verify.
	Key *receipt.Key
	// ClusterDomain is the cluster's DNS domain (the manager's
	// --cluster-domain; cluster.local when empty): LMCACHE_REMOTE_URL is
	// topology.Endpoint of the spec in it, and in multiprocess mode the
	// connector's lmcache.mp.host is topology.Host.
	ClusterDomain string
	// Limits bound the admission handler's memory and concurrency.
	Limits Limits
}

// Limits bound what one pod webhook and many concurrent ones can cost the
// manager, whose controllers share its memory.
type Limits struct {
	// MaxRequestBytes: a larger admission request is not decoded; the pod
	// is admitted unwired (fail open) with a warning, a log line and
	// the guard trips metric{reason="oversized"}. DefaultMaxRequestBytes when zero.
	MaxRequestBytes int64
	// MaxConcurrent admissions are decoded and decided at once; the others
	// wait for a slot until their request's deadline, then fail open
	// (the guard trips metric{reason="busy"}). DefaultMaxConcurrent when zero.
	MaxConcurrent int
}

// Defaults of Limits. An engine pod's admission request is a few KiB; one
// with a megabyte of env or arguments is not a pod the webhook should wire.
const (
	DefaultMaxRequestBytes = 1 << 20
	DefaultMaxConcurrent   = 8
)

// Decision is the verdict on one pod.
type Decision struct {
	Outcome Outcome
	// Backend is the CacheBackend that matched (nil on NoMatch).
	Backend *v1alpha1.CacheBackend
	// Reason is a fixed, machine-readable reason (the Skipped* and FailOpen*
	// constants), empty for Injected and NoMatch.
	Reason string
	// Message explains the verdict to a person.
	Message string
	// Pod is the pod as it should be admitted: a mutated copy of the input.
	Pod *corev1.Pod
}

// Names the injection uses.
const (
	KVTransferConfigFlag   = "--kv-transfer-config"
	KVEventsConfigFlag     = "--kv-events-config"
	LMCacheConnector       = "LMCacheConnectorV1"
	SubscriberContainer    = "kvevent-subscriber"
	envRemoteURL           = "LMCACHE_REMOTE_URL"
	envRemoteSerde         = "LMCACHE_REMOTE_SERDE"
	envChunkSize           = "LMCACHE_CHUNK_SIZE"
	envLocalCPU            = "LMCACHE_LOCAL_CPU"
	envMaxLocalCPUSize     = "LMCACHE_MAX_LOCAL_CPU_SIZE"
	envLocalDisk           = "LMCACHE_LOCAL_DISK"
	envMaxLocalDiskSize    = "LMCACHE_MAX_LOCAL_DISK_SIZE"
	envSubscriberModelID   = "MODEL_ID"
	envSubscriberEndpoint  = "KV_EVENTS_ENDPOINT"
	envSubscriberNamespace = "CACHEBACKEND"
)

// SkipRequested reports whether an v1alpha1.AnnotationSkipInject value opts a pod out:
// any non-empty value except those Go's strconv.ParseBool reads as false
// (0, f, F, false, FALSE, False) and no, off, disable, disabled in any case.
// The rule is exact: the value is not trimmed, so " " and " false " are
// non-empty values outside the falsey set and opt the pod out.
func SkipRequested(value string) bool {
	v := value
	if v == "" {
		return false
	}
	if b, err := strconv.ParseBool(v); err == nil && !b {
		return false
	}
	switch strings.ToLower(v) {
	case "no", "off", "disable", "disabled":
		return false
	}
	return true
}

// Decide returns the verdict on pod given the CacheBackends of its
// namespace. It does not modify its inputs.
func Decide(pod *corev1.Pod, backends []v1alpha1.CacheBackend, opts Options) Decision {
	out := pod.DeepCopy()
	cb := v1alpha1.Claimant(pod.Labels, backends)
	if cb == nil {
		clearReceipts(out)
		return Decision{Outcome: NoMatch, Pod: out, Message: "no CacheBackend selector matches the pod's labels"}
	}
	d := Decision{Backend: cb, Pod: out}
	clearReceipts(out)

	if SkipRequested(pod.Annotations[v1alpha1.AnnotationSkipInject]) {
		return skip(d, v1alpha1.SkippedByAnnotation, fmt.Sprintf("pod opts out with %s=%q", v1alpha1.AnnotationSkipInject, pod.Annotations[v1alpha1.AnnotationSkipInject]))
	}
	if cb.Spec.Type == v1alpha1.BackendTypeLMCache && cb.Status.Endpoint == "" {
		d.Outcome, d.Reason = FailOpen, v1alpha1.FailOpenNoEndpoint
		d.Message = fmt.Sprintf("CacheBackend %s/%s has no status.endpoint yet; pod admitted unwired (restart it once the backend is Ready)", cb.Namespace, cb.Name)
		return d
	}
	if want := topology.Endpoint(cb, opts.ClusterDomain); cb.Spec.Type == v1alpha1.BackendTypeLMCache && cb.Status.Endpoint != want {
		// Status only says whether the server is available; the address
		// always comes from the spec. A status that names another address
		// was not written by this operator (or by one with another
		// --cluster-domain): wire nothing rather than either address.
		d.Outcome, d.Reason = FailOpen, v1alpha1.FailOpenEndpointMismatch
		d.Message = fmt.Sprintf("CacheBackend %s/%s publishes status.endpoint %q, not %q derived from its spec; pod admitted unwired", cb.Namespace, cb.Name, cb.Status.Endpoint, want)
		return d
	}
	idx := engineContainer(out, cb)
	if idx < 0 {
		d.Outcome, d.Reason = FailOpen, v1alpha1.FailOpenContainerNotFound
		d.Message = fmt.Sprintf("pod has no container %q (spec.integration.engineContainer of %s/%s)", cb.Spec.Integration.EngineContainer, cb.Namespace, cb.Name)
		return d
	}
	c := &out.Spec.Containers[idx]
	cmdline := append(slices.Clone(c.Command), c.Args...)
	if len(c.Command) > 0 {
		if sh, wrapped := shellCommand(cmdline); wrapped {
			return skip(d, v1alpha1.SkippedShellWrapper, fmt.Sprintf("container %q runs a shell command line (%s -c); add %s and the LMCache variables to it by hand, or run the engine directly", c.Name, sh, KVTransferConfigFlag))
		}
	}
	if topology.Of(cb) == topology.EngineLocal {
		if f := hiCacheExclusiveSet(cmdline); f != "" {
			return skip(d, v1alpha1.SkippedUserConfig, fmt.Sprintf("container %q sets %s, which SGLang refuses together with --enable-hierarchical-cache (\"mutually exclusive\"); the webhook leaves the pod unwired rather than make it fail at start", c.Name, f))
		}
	}
	var rel Releases // what the LMCache wiring follows (releases.go)
	if cb.Spec.Type == v1alpha1.BackendTypeLMCache {
		rel = ReleasesOf(pod, c, cb)
	}
	if topology.Of(cb) == topology.Multiprocess {
		if why := isolatedIPCUnsupported(c, cmdline); why != "" {
			return skip(d, v1alpha1.SkippedIsolatedIPCUnsupported, why+"; the webhook leaves the pod unwired")
		}
		if why := chunkMisaligned(cmdline); why != "" {
			return skip(d, v1alpha1.SkippedChunkSizeMisaligned, fmt.Sprintf("container %q: %s; the webhook leaves the pod unwired", c.Name, why))
		}
	} else if cb.Spec.Type == v1alpha1.BackendTypeLMCache {
		if why := inProcessRefused(rel); why != "" {
			return skip(d, v1alpha1.SkippedEngineRelease, why+"; the webhook leaves the pod unwired")
		}
	}
	want := DesiredFor(cb, opts, rel, cmdline)
	if msg := overridesDenied(cb, pod); msg != "" {
		return skip(d, v1alpha1.SkippedOverrideNotAllowed, msg)
	}
	conflicts := apply(c, want, Abbreviates(cb.Spec.Runtime))
	if want.SharedMemory != nil {
		conflicts = append(conflicts, ensureDevShm(out, c, *want.SharedMemory)...)
	}
	if want.NumbaCache {
		conflicts = append(conflicts, ensureNumbaCache(out, c)...)
	}
	if len(conflicts) > 0 {
		// apply changed nothing it reports as a conflict, but it may have
		// started to: start again from the unmodified pod.
		d.Pod = pod.DeepCopy()
		clearReceipts(d.Pod)
		return skip(d, v1alpha1.SkippedUserConfig, fmt.Sprintf("container %q already sets %s differently; the webhook never overwrites a pod's own configuration", c.Name, strings.Join(conflicts, ", ")))
	}
	plan := PlanKVEvents(cb, opts, pod, c)
	switch wiring := plan.Wiring; {
	case wiring != nil:
		addFlags(c, wiring.Flags, Abbreviates(cb.Spec.Runtime))
		if !slices.ContainsFunc(out.Spec.InitContainers, func(x corev1.Container) bool { return x.Name == SubscriberContainer }) {
			out.Spec.InitContainers = append(out.Spec.InitContainers, wiring.Sidecar)
		}
		for _, v := range wiring.Volumes {
			if !slices.ContainsFunc(out.Spec.Volumes, func(x corev1.Volume) bool { return x.Name == v.Name }) {
				out.Spec.Volumes = append(out.Spec.Volumes, v)
			}
		}
	case plan.Reason != "":
		setAnnotation(out, v1alpha1.AnnotationKVEventsSkipped, plan.Reason)
		d.Message = plan.Message
	}
	setAnnotation(out, v1alpha1.AnnotationInjectedBy, cb.Namespace+"/"+cb.Name)
	setAnnotation(out, v1alpha1.AnnotationInjectedByUID, string(cb.UID))
	setAnnotation(out, v1alpha1.AnnotationInjectedGeneration, strconv.FormatInt(cb.Generation, 10))
	if cb.Spec.Type == v1alpha1.BackendTypeLMCache {
		// The wiring follows the vLLM and LMCache releases (releases.go);
		// SGLang's HiCache flags do not depend on a release yet.
		setAnnotation(out, v1alpha1.AnnotationWiredFor, rel.String())
	}
	if msg := rel.note(cb); msg != "" {
		if d.Message != "" {
			d.Message += "; "
		}
		d.Message += msg
	}
	claim := ClaimOf(out)
	claim.Digest = receipt.Digest(out)
	setAnnotation(out, v1alpha1.AnnotationInjectedConfigDigest, claim.Digest)
	if opts.Key != nil {
		setAnnotation(out, v1alpha1.AnnotationReceiptSignature, receipt.Sign(*opts.Key, claim))
	}
	d.Outcome = Injected
	wired := fmt.Sprintf("container %q wired to CacheBackend %s/%s (generation %d)", c.Name, cb.Namespace, cb.Name, cb.Generation)
	if d.Message != "" {
		wired += "; " + d.Message
	}
	d.Message = wired
	return d
}

// ClaimOf reads the receipt claim on a pod.
func ClaimOf(p *corev1.Pod) receipt.Claim {
	return receipt.ClaimOf(p.Annotations)
}

func skip(d Decision, reason, msg string) Decision {
	d.Outcome, d.Reason, d.Message = Skipped, reason, msg
	setAnnotation(d.Pod, v1alpha1.AnnotationInjectSkipped, reason)
	return d
}

// strippedAnnotations are the annotations the webhook removes from every
// pod it admits, matched or not (see clearReceipts).
var strippedAnnotations = []string{v1alpha1.AnnotationInjectedBy, v1alpha1.AnnotationInjectedByUID, v1alpha1.AnnotationInjectedGeneration, v1alpha1.AnnotationInjectSkipped, v1alpha1.AnnotationKVEventsSkipped,
	v1alpha1.AnnotationInjectedConfigDigest, v1alpha1.AnnotationReceiptSignature, v1alpha1.AnnotationWiredFor}

// CarriesStripped reports whether annotations hold one the webhook
// strips from every pod it admits (a receipt a user pre-set, or a skip
// stamp): such a pod is decided even when no CacheBackend claims it.
func CarriesStripped(annotations map[string]string) bool {
	for _, k := range strippedAnnotations {
		if _, ok := annotations[k]; ok {
			return true
		}
	}
	return false
}

// Stripped reports whether the webhook strips the annotation key from
// every pod it admits.
func Stripped(key string) bool { return slices.Contains(strippedAnnotations, key) }

// clearReceipts removes every receipt annotation, so that no pod keeps a
// stale, partial or hand-written receipt past admission.
func clearReceipts(p *corev1.Pod) {
	for _, k := range strippedAnnotations {
		delete(p.Annotations, k)
	}
	if len(p.Annotations) == 0 {
		p.Annotations = nil
	}
}

func setAnnotation(p *corev1.Pod, k, v string) {
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[k] = v
}

// engineContainer is the index of the container to wire: the one named by
// spec.integration.engineContainer, else the first; -1 when there is none.
func engineContainer(p *corev1.Pod, cb *v1alpha1.CacheBackend) int {
	name := cb.Spec.Integration.EngineContainer
	if name == "" {
		if len(p.Spec.Containers) == 0 {
			return -1
		}
		return 0
	}
	return slices.IndexFunc(p.Spec.Containers, func(c corev1.Container) bool { return c.Name == name })
}

// Flag is one command-line flag the injection ensures; Value is empty for
// a boolean flag.
type Flag struct {
	Name, Value string
}

// Config is the engine configuration a CacheBackend asks for: what the
// webhook ensures on the engine container, in order.
type Config struct {
	Flags []Flag
	Env   []corev1.EnvVar
	// ExtraArgs are engineOverrides.args then engineOverrides.optIn.args,
	// ensured as one contiguous run.
	ExtraArgs []string
	// SharedMemory, when set, is the size of the private memory-backed
	// /dev/shm the engine container gets (multiprocess mode) unless it
	// mounts its own there.
	SharedMemory *resource.Quantity
	// NumbaCache, when set, gives the engine container a writable numba
	// cache (NumbaCacheDir) unless it sets NUMBA_CACHE_DIR itself.
	NumbaCache bool
}

// DesiredFor computes the configuration cb injects into an engine of
// releases rel whose command line is cmdline: the canonical settings of
// its type (for LMCache in multiprocess mode, the MP connector as the
// release takes it, its env and a private /dev/shm), then
// integration.engineOverrides (an override env var replaces a canonical
// one of the same name). The KV-event wiring depends on the pod too: see
// PlanKVEvents.
func DesiredFor(cb *v1alpha1.CacheBackend, opts Options, rel Releases, cmdline []string) Config {
	var cfg Config
	switch cb.Spec.Type {
	case v1alpha1.BackendTypeLMCache:
		if topology.Of(cb) == topology.Multiprocess {
			// The node's MP server holds the tiers: no in-process LMCache
			// settings, no LMCACHE_REMOTE_URL.
			modulePath, optOut := mpWiring(rel)
			cfg.Flags = append(cfg.Flags, mpTransfer(cb, opts.ClusterDomain, modulePath))
			if optOut && setsExtensibleKVCache(cmdline) == "" {
				cfg.Flags = append(cfg.Flags, Flag{Name: ExtensibleKVCacheOptOut})
			}
			cfg.Env = mpEnv()
			cfg.SharedMemory = ptr.To(EngineSharedMemory(cb))
			cfg.NumbaCache = true
			break
		}
		cfg.Flags = append(cfg.Flags, Flag{KVTransferConfigFlag, kvTransferConfig(cb.Spec.Integration.Role)})
		cfg.Env = lmcacheEnv(cb, opts.ClusterDomain)
		cfg.NumbaCache = true
	case v1alpha1.BackendTypeSGLangHiCache:
		cfg.Flags = hiCacheFlags(cb.Spec.HiCache)
	}
	if o := cb.Spec.Integration.EngineOverrides; o != nil {
		for _, e := range overrideEnv(o) {
			if i := slices.IndexFunc(cfg.Env, func(x corev1.EnvVar) bool { return x.Name == e.Name }); i >= 0 {
				cfg.Env[i] = e
			} else {
				cfg.Env = append(cfg.Env, e)
			}
		}
		cfg.ExtraArgs = OverrideArgs(o)
	}
	return cfg
}

// KVRole maps an integration role to vLLM's kv_role.
func KVRole(r v1alpha1.IntegrationRole) string {
	switch r {
	case v1alpha1.RoleReadOnly:
		return "kv_consumer"
	case v1alpha1.RoleWriteOnly:
		return "kv_producer"
	default:
		return "kv_both"
	}
}

func kvTransferConfig(r v1alpha1.IntegrationRole) string {
	b, _ := json.Marshal(struct {
		Connector string `json:"kv_connector"`
		Role      string `json:"kv_role"`
	}{LMCacheConnector, KVRole(r)})
	return string(b)
}

func lmcacheEnv(cb *v1alpha1.CacheBackend, domain string) []corev1.EnvVar {
	env := []corev1.EnvVar{{Name: envRemoteURL, Value: topology.Endpoint(cb, domain)}}
	lc := cb.Spec.LMCache
	serde := "naive"
	if lc != nil && lc.Serde != "" {
		serde = lc.Serde
	}
	env = append(env, corev1.EnvVar{Name: envRemoteSerde, Value: serde})
	if lc == nil {
		return env
	}
	if lc.ChunkSize != nil {
		env = append(env, corev1.EnvVar{Name: envChunkSize, Value: strconv.Itoa(int(*lc.ChunkSize))})
	}
	if lc.LocalCPU != nil {
		env = append(env,
			corev1.EnvVar{Name: envLocalCPU, Value: "True"},
			corev1.EnvVar{Name: envMaxLocalCPUSize, Value: GiB(lc.LocalCPU.MaxSize)})
	}
	if lc.LocalDisk != nil {
		p := lc.LocalDisk.Path
		if !strings.HasSuffix(p, "/") {
			p += "/"
		}
		env = append(env,
			corev1.EnvVar{Name: envLocalDisk, Value: "file://" + p},
			corev1.EnvVar{Name: envMaxLocalDiskSize, Value: GiB(lc.LocalDisk.MaxSize)})
	}
	return env
}

// GiB renders a Kubernetes quantity as the plain number LMCache parses for
// its sizes: a decimal count of GiB, exact, e.g. 4Gi → "4", 512Mi → "0.5",
// 1500Mi → "1.46484375", 10G → "9.313225746154785". LMCache reads it with
// float() and allocates int(size * 1024**3) bytes, which gives back the
// quantity's bytes: dividing and multiplying by a power of two is exact in
// binary floating point and the shortest decimal reads back as the same
// float. A rounded value would not: 1500Mi rounded to "1.465" is 164 KiB
// more than the user's maxSize, and anything under 0.5 MiB rounded to "0",
// which turns LMCache's tier off.
func GiB(q resource.Quantity) string {
	return strconv.FormatFloat(float64(q.Value())/float64(1<<30), 'f', -1, 64)
}

// HiCacheExclusiveFlags are the SGLang flags its argument resolution
// refuses together with --enable-hierarchical-cache, which the webhook
// always sets: an engine with one of them fails at start once wired.
var HiCacheExclusiveFlags = []string{"--disable-radix-cache", "--enable-lmcache", "--enable-unified-cache-external-linker"}

// hiCacheExclusiveSet returns the first of HiCacheExclusiveFlags cmdline
// sets, in any spelling SGLang's parser reads (abbreviations included).
func hiCacheExclusiveSet(cmdline []string) string {
	for _, a := range cmdline {
		if a == "--" {
			break
		}
		key, _, _ := strings.Cut(a, "=")
		for _, f := range HiCacheExclusiveFlags {
			if SpellsFlag(key, f, true) {
				return f
			}
		}
	}
	return ""
}

func hiCacheFlags(h *v1alpha1.HiCache) []Flag {
	flags := []Flag{{Name: "--enable-hierarchical-cache"}}
	if h == nil {
		return flags
	}
	add := func(name, v string) {
		if v != "" {
			flags = append(flags, Flag{name, v})
		}
	}
	if h.Ratio != nil {
		add("--hicache-ratio", *h.Ratio)
	}
	if h.SizeGB != nil {
		add("--hicache-size", strconv.Itoa(int(*h.SizeGB)))
	}
	add("--hicache-write-policy", string(h.WritePolicy))
	add("--hicache-io-backend", string(h.IOBackend))
	add("--hicache-mem-layout", string(h.MemLayout))
	add("--hicache-storage-backend", string(h.StorageBackend))
	add("--hicache-storage-prefetch-policy", string(h.StoragePrefetchPolicy))
	if h.PageSize != nil {
		add("--page-size", strconv.Itoa(int(*h.PageSize)))
	}
	return flags
}

// apply ensures cfg on c: each flag and env var is added where missing and
// left alone where present with the same value. It returns the names of
// settings c already has with another value (the pod is then not wired):
// a flag set differently in any spelling the engine reads, or set twice,
// or in part (a dotted sub-key); an env var set differently, twice (the
// kubelet keeps the last) or from a ConfigMap or Secret; any envFrom (its
// keys are not visible at admission). Applying a Config twice changes
// nothing the second time.
func apply(c *corev1.Container, cfg Config, abbrev bool) []string {
	var conflicts []string
	if len(c.EnvFrom) > 0 {
		conflicts = append(conflicts, "envFrom")
	}
	cmdline := append(slices.Clone(c.Command), c.Args...)
	for _, f := range cfg.Flags {
		uses := FlagUses(cmdline, f.Name, abbrev)
		switch {
		case len(uses) == 0:
			c.Args = append(c.Args, f.Name)
			if f.Value != "" {
				c.Args = append(c.Args, f.Value)
			}
		case len(uses) > 1 || uses[0].Partial:
			conflicts = append(conflicts, f.Name)
		case f.Value != "" && uses[0].Value != f.Value && !sameJSON(uses[0].Value, f.Value):
			conflicts = append(conflicts, f.Name)
		}
	}
	for _, e := range cfg.Env {
		var have []corev1.EnvVar
		for _, x := range c.Env {
			if x.Name == e.Name {
				have = append(have, x)
			}
		}
		switch {
		case len(have) == 0:
			c.Env = append(c.Env, e)
		case len(have) > 1 || have[0].Value != e.Value || !equality.Semantic.DeepEqual(have[0].ValueFrom, e.ValueFrom):
			conflicts = append(conflicts, "env "+e.Name)
		}
	}
	if len(cfg.ExtraArgs) > 0 && !containsRun(append(slices.Clone(c.Command), c.Args...), cfg.ExtraArgs) {
		c.Args = append(c.Args, cfg.ExtraArgs...)
	}
	return conflicts
}

// overridesDenied applies the engineOverrides guard (overrides.go) to a
// pod: the reason it may not receive cb's overrides, or "".
func overridesDenied(cb *v1alpha1.CacheBackend, pod *corev1.Pod) string {
	o := cb.Spec.Integration.EngineOverrides
	if o == nil {
		return ""
	}
	for _, e := range overrideEnv(o) {
		if why := EnvNameDenied(e.Name); why != "" {
			return fmt.Sprintf("spec.integration.engineOverrides of %s/%s sets %s, which the operator never injects: %s", cb.Namespace, cb.Name, e.Name, why)
		}
		if ReadsSecret(e) && pod.Annotations[AnnotationAllowSecretOverrides] != "true" {
			return fmt.Sprintf("spec.integration.engineOverrides of %s/%s reads %s from Secret %q; the pod must opt in with %s=\"true\"",
				cb.Namespace, cb.Name, e.Name, e.ValueFrom.SecretKeyRef.Name, AnnotationAllowSecretOverrides)
		}
	}
	if why := NeedsOptIn(cb); why != "" && pod.Annotations[AnnotationAllowOverrides] != "true" {
		return fmt.Sprintf("CacheBackend %s/%s wires only pods that opt in to its engineOverrides (%s); annotate the workload's pod template with %s: \"true\" to accept them",
			cb.Namespace, cb.Name, why, AnnotationAllowOverrides)
	}
	return ""
}

// restricted is a security context that meets the Pod Security Standard
// "restricted" for the containers the webhook adds.
func restricted() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		RunAsNonRoot:             ptr.To(true),
		ReadOnlyRootFilesystem:   ptr.To(true),
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// subscriberResources are the kvevent-subscriber sidecar's requests and
// limits: it decodes a ZeroMQ stream and forwards it, in little memory.
func subscriberResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("200m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
	}
}

func containsRun(s, run []string) bool {
	for i := 0; i+len(run) <= len(s); i++ {
		if slices.Equal(s[i:i+len(run)], run) {
			return true
		}
	}
	return false
}

func sameJSON(a, b string) bool {
	var x, y any
	if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return string(xa) == string(ya)
}
