package inject

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/inferencecache/operator/api/v1alpha1"

	"github.com/inferencecache/operator/internal/imageref"
	"github.com/inferencecache/operator/internal/topology"
)

// The KV-event wiring (docs/design/kvevent-subscriber.md, "Wiring"): the
// engine publishes its KV-cache events on ZeroMQ sockets that stay inside
// the pod, and the kvevent-subscriber sidecar follows them and forwards
// block hashes to the KV-block index.
//
// With data-parallel size 1 both sockets are abstract-namespace Unix
// sockets (ipc://@name). Abstract sockets live in the pod's network
// namespace: every container of the pod reaches them whatever its UID, and
// nothing outside the pod does. A socket file on a shared emptyDir would
// not do: libzmq creates it with the engine's umask (srwxr-xr-x), and
// connecting to a Unix socket needs write permission on it, so a non-root
// sidecar could not connect to an engine running as root (the vLLM image's
// default).
//
// vLLM offsets the endpoints of data-parallel rank r by r and refuses to
// offset ipc://, so with data-parallel size N > 1 the sockets are TCP: the
// replay ROUTER (which serves the buffered history on request) binds the
// loopback address only, and the PUB socket binds every interface of the
// pod (vLLM binds a PUB endpoint only when it contains "*", "::" or
// 0.0.0.0; any other tcp:// address it connects to). Ranks use ports
// KVEventsPort+r (PUB) and KVEventsPort+N+r (replay).
const (
	// HashAlgoFlag is vLLM's block-hash algorithm flag.
	HashAlgoFlag = "--prefix-caching-hash-algo"
	// HashAlgoSHA256CBOR is the algorithm the webhook sets for vLLM: the
	// only one whose block hashes the index can recompute from tokens.
	HashAlgoSHA256CBOR = "sha256_cbor"
	// hashAlgoSGLang is SGLang's chained SHA-256 of the page tokens.
	hashAlgoSGLang = "sglang_sha256"
	// sglangDefaultPageSize is SGLang's page size when --page-size is
	// unset (sglang/srt/arg_groups/overrides.py, _page_size_default; the
	// conformance suite holds it to SGLang's resolution).
	sglangDefaultPageSize = "1"
	// sglangDefaultPort is SGLang's HTTP port when --port is not given
	// (sglang.srt.arg_groups: port = 30000).
	sglangDefaultPort = "30000"
	// hashAlgoUnknown tells the subscriber the algorithm could not be read
	// from the command line; it then reports hashes as unverifiable.
	hashAlgoUnknown = "unknown"
	// KVEventsTopic is frame 0 of every message the engine publishes.
	KVEventsTopic = "kv"
	// KVEventsPubIPC and KVEventsReplayIPC are the engine's sockets with
	// data-parallel size 1.
	KVEventsPubIPC    = "ipc://@inferencecache-kvevents-pub"
	KVEventsReplayIPC = "ipc://@inferencecache-kvevents-replay"
	// KVEventsPort is rank 0's PUB port with data-parallel size > 1.
	KVEventsPort = 5557
	// IndexTokenDir is where the sidecar reads its projected token.
	IndexTokenDir = "/var/run/secrets/inferencecache.io/index"
	// IndexTokenPath is the token file (INDEX_TOKEN_FILE).
	IndexTokenPath = IndexTokenDir + "/token"
	// indexTokenExpiry is the token's requested lifetime; the kubelet
	// rotates it at 80% and the sidecar rereads it on every connect.
	indexTokenExpiry = 3600
	// subscriberProbePort serves the sidecar's /healthz, /readyz, /metrics.
	subscriberProbePort = 8090
	// maxDataParallel bounds the ranks the webhook wires (the subscriber's
	// own limit).
	maxDataParallel = 1024
)

// Environment the kvevent-subscriber reads (cmd/kvevent-subscriber).
const (
	envKVEventsReplay    = "KV_EVENTS_REPLAY_ENDPOINT"
	envKVEventsTopic     = "KV_EVENTS_TOPIC"
	envKVEventsDPSize    = "KV_EVENTS_DP_SIZE"
	envKVEventsEngine    = "KV_EVENTS_ENGINE"
	envKVEventsHashAlgo  = "KV_EVENTS_HASH_ALGORITHM"
	envKVEventsHashSeeds = "KV_EVENTS_HASH_SEEDS"
	envKVEventsBlockSize = "KV_EVENTS_BLOCK_SIZE"
	envWorkerPort        = "WORKER_PORT"
	envIndexEndpoint     = "INDEX_ENDPOINT"
	envIndexTokenFile    = "INDEX_TOKEN_FILE"
	envPythonHashSeed    = "PYTHONHASHSEED"
)

// KVEventsWiring is what the webhook adds to a pod for KV-event observation.
type KVEventsWiring struct {
	// Flags are added to the engine container where absent (never
	// replacing a user's own value).
	Flags []Flag
	// Sidecar is the kvevent-subscriber, a native sidecar: appended to the
	// init containers with restartPolicy Always, so it runs before the
	// engine starts and until after it stops.
	Sidecar corev1.Container
	// Volumes are added to the pod (the index token, when the manager knows
	// the index's address).
	Volumes []corev1.Volume
}

// KVEventsPlan is PlanKVEvents' verdict on one pod: the wiring to add, or
// why there is none.
type KVEventsPlan struct {
	// Wiring is what to add; nil when observation is off or the pod cannot
	// get the sidecar.
	Wiring *KVEventsWiring
	// Reason is the v1alpha1.KVEvents* value of AnnotationKVEventsSkipped
	// when observation is on but this pod cannot get the sidecar; empty
	// otherwise.
	Reason string
	// Message explains Reason to a person.
	Message string
}

// PlanKVEvents decides the KV-event wiring of engine container c in pod for
// cb. The plan is empty when observation is off (the manager has no
// --kvevent-subscriber-image or cb no spec.observation.modelID); it has a
// KVEvents* reason with a message and no wiring when observation is on but
// this pod cannot get the sidecar. c is read after the cache flags were
// applied, so flags the webhook itself adds (SGLang's --page-size) count.
func PlanKVEvents(cb *v1alpha1.CacheBackend, opts Options, pod *corev1.Pod, c *corev1.Container) KVEventsPlan {
	if opts.KVEventSubscriberImage == "" || cb.Spec.Observation == nil || cb.Spec.Observation.ModelID == "" {
		return KVEventsPlan{}
	}
	abbrev := Abbreviates(cb.Spec.Runtime)
	cmdline := append(slices.Clone(c.Command), c.Args...)
	dp, dpOK := DataParallelSize(cmdline, cb.Spec.Runtime)
	vllm := cb.Spec.Runtime != v1alpha1.RuntimeSGLang
	pub, replay := KVEventsPubIPC, KVEventsReplayIPC
	subPub, subReplay := pub, replay
	if dp > 1 {
		pub = fmt.Sprintf("tcp://*:%d", KVEventsPort)
		replay = fmt.Sprintf("tcp://127.0.0.1:%d", KVEventsPort+dp)
		subPub, subReplay = fmt.Sprintf("tcp://127.0.0.1:%d", KVEventsPort), replay
	}
	config := kvEventsConfig(vllm, pub, replay)
	// A --kv-events-config equal to the one the webhook sets is its own
	// (a pod admitted twice); any other is the user's.
	if uses := FlagUses(cmdline, KVEventsConfigFlag, abbrev); len(uses) > 0 &&
		(!dpOK || len(uses) > 1 || uses[0].Partial || !sameJSON(uses[0].Value, config)) {
		return KVEventsPlan{Reason: v1alpha1.KVEventsUserConfig, Message: fmt.Sprintf("container %q sets its own %s: kept, and no %s sidecar added", c.Name, KVEventsConfigFlag, SubscriberContainer)}
	}
	if pod.Spec.HostNetwork {
		return KVEventsPlan{Reason: v1alpha1.KVEventsHostNetwork, Message: fmt.Sprintf("the pod uses the node's network namespace (spec.hostNetwork): its KV-event sockets would be the node's, reachable by every process there; no %s sidecar added",
			SubscriberContainer)}
	}
	if vllm && !PrefixCachingOn(cmdline) {
		return KVEventsPlan{Reason: v1alpha1.KVEventsPrefixCachingOff, Message: fmt.Sprintf("container %q turns vLLM's prefix caching off (--no-enable-prefix-caching): vLLM publishes no block events without it; no %s sidecar added",
			c.Name, SubscriberContainer)}
	}
	if !dpOK {
		return KVEventsPlan{Reason: v1alpha1.KVEventsDataParallel, Message: fmt.Sprintf("container %q sets data-parallel flags the webhook cannot follow (multi-node ranks, not a size from 1 to %d, or set twice); no %s sidecar added",
			c.Name, maxDataParallel, SubscriberContainer)}
	}
	w := &KVEventsWiring{}
	engine, algo, blockSize := "vllm", HashAlgoSHA256CBOR, lastValue(cmdline, "--block-size", false)
	seeds, workerPort := "", ""
	w.Flags = append(w.Flags, Flag{KVEventsConfigFlag, config})
	if !vllm {
		engine, algo, blockSize = "sglang", hashAlgoSGLang, lastValue(cmdline, "--page-size", true)
		if blockSize == "" {
			// Without --page-size SGLang pages 1 token (its default on
			// CUDA and CPU), not the subscriber's default block of 16.
			blockSize = sglangDefaultPageSize
		}
		// The pod's IP and SGLang's HTTP port make the URL SGLang's
		// router names the worker by; the index answers the router's
		// prefix queries with it.
		if workerPort = lastValue(cmdline, "--port", true); workerPort == "" {
			workerPort = sglangDefaultPort
		}
	} else {
		if uses := FlagUses(cmdline, HashAlgoFlag, abbrev); len(uses) > 0 {
			// The user's own algorithm is kept; the subscriber is told it.
			algo = uses[len(uses)-1].Value
			if algo == "" || uses[len(uses)-1].Partial {
				algo = hashAlgoUnknown
			}
		} else {
			w.Flags = append(w.Flags, Flag{HashAlgoFlag, HashAlgoSHA256CBOR})
		}
		// vLLM seeds NONE_HASH with $PYTHONHASHSEED when it is set.
		if i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == envPythonHashSeed }); i >= 0 && c.Env[i].ValueFrom == nil && c.Env[i].Value != "" {
			seeds = c.Env[i].Value
		}
	}

	env := []corev1.EnvVar{
		{Name: envSubscriberEndpoint, Value: subPub},
		{Name: envKVEventsReplay, Value: subReplay},
		{Name: envKVEventsTopic, Value: KVEventsTopic},
		{Name: envKVEventsDPSize, Value: strconv.Itoa(dp)},
		{Name: envKVEventsEngine, Value: engine},
		{Name: envKVEventsHashAlgo, Value: algo},
	}
	if seeds != "" {
		env = append(env, corev1.EnvVar{Name: envKVEventsHashSeeds, Value: seeds})
	}
	if blockSize != "" {
		env = append(env, corev1.EnvVar{Name: envKVEventsBlockSize, Value: blockSize})
	}
	if workerPort != "" {
		env = append(env, fieldEnv("POD_IP", "status.podIP"), corev1.EnvVar{Name: envWorkerPort, Value: workerPort})
	}
	env = append(env,
		corev1.EnvVar{Name: envSubscriberModelID, Value: cb.Spec.Observation.ModelID},
		corev1.EnvVar{Name: envSubscriberNamespace, Value: cb.Namespace + "/" + cb.Name},
		fieldEnv("POD_NAME", "metadata.name"),
		fieldEnv("POD_NAMESPACE", "metadata.namespace"),
		fieldEnv("POD_UID", "metadata.uid"),
		fieldEnv("NODE_NAME", "spec.nodeName"),
	)
	// Every field the API server would default is set here, as it would
	// set it: the receipt's digest covers the sidecar as stored.
	w.Sidecar = corev1.Container{
		Name:          SubscriberContainer,
		Image:         opts.KVEventSubscriberImage,
		RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
		Ports:         []corev1.ContainerPort{{Name: "kvevents-http", ContainerPort: subscriberProbePort, Protocol: corev1.ProtocolTCP}},
		// The engine starts once the subscriber's loops run, so it never
		// publishes sequence 0 to nobody.
		StartupProbe: &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: "/readyz", Port: intstr.FromInt32(subscriberProbePort), Scheme: corev1.URISchemeHTTP}},
			TimeoutSeconds:   1,
			PeriodSeconds:    1,
			SuccessThreshold: 1,
			FailureThreshold: 30,
		},
		SecurityContext:          restricted(),
		Resources:                subscriberResources(),
		TerminationMessagePath:   corev1.TerminationMessagePathDefault,
		TerminationMessagePolicy: corev1.TerminationMessageReadFile,
		ImagePullPolicy:          DefaultPullPolicy(opts.KVEventSubscriberImage),
		// The API token's path, empty: the API server runs its
		// ServiceAccount admission again after a webhook changed a pod,
		// and would mount the pod's token into a container that has
		// nothing there.
		VolumeMounts: []corev1.VolumeMount{{Name: v1alpha1.VolumeNoAPIToken, MountPath: ServiceAccountTokenDir, ReadOnly: true}},
	}
	w.Volumes = []corev1.Volume{{Name: v1alpha1.VolumeNoAPIToken, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	if opts.IndexEndpoint != "" {
		env = append(env,
			corev1.EnvVar{Name: envIndexEndpoint, Value: opts.IndexEndpoint},
			corev1.EnvVar{Name: envIndexTokenFile, Value: IndexTokenPath})
		w.Sidecar.VolumeMounts = append(w.Sidecar.VolumeMounts, corev1.VolumeMount{Name: v1alpha1.VolumeIndexToken, MountPath: IndexTokenDir, ReadOnly: true})
		w.Volumes = append(w.Volumes, corev1.Volume{Name: v1alpha1.VolumeIndexToken, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{
				Audience: v1alpha1.IndexTokenAudience, ExpirationSeconds: ptr.To[int64](indexTokenExpiry), Path: "token",
			}}},
			DefaultMode: ptr.To(corev1.ProjectedVolumeSourceDefaultMode),
		}}})
	}
	w.Sidecar.Env = env
	if taken := namesTaken(pod, w); taken != "" {
		return KVEventsPlan{Reason: v1alpha1.KVEventsNameTaken, Message: fmt.Sprintf("the pod already has a %s; no %s sidecar added", taken, SubscriberContainer)}
	}
	return KVEventsPlan{Wiring: w}
}

// DefaultIndexEndpoint is the gRPC address of the install bundle's
// headless KV-block index Service (inferencecache-index-peers) in the
// operator's namespace and the cluster's DNS domain (cluster.local when
// empty): the manager's default --kvindex-endpoint. The name resolves to
// every ready index replica and the sidecar forwards to each, so every
// replica of the in-memory index holds every pod.
func DefaultIndexEndpoint(namespace, domain string) string {
	if domain == "" {
		domain = topology.DefaultClusterDomain
	}
	return fmt.Sprintf("%s.%s.svc.%s:%d", v1alpha1.IndexPeersService, namespace, domain, v1alpha1.IndexGRPCPort)
}

// kvEventsConfig is the --kv-events-config value. vLLM needs
// enable_kv_cache_events; SGLang publishes whenever the flag is present
// and has no such field.
func kvEventsConfig(vllm bool, pub, replay string) string {
	type config struct {
		Enable   *bool  `json:"enable_kv_cache_events,omitempty"`
		Pub      string `json:"publisher"`
		Endpoint string `json:"endpoint"`
		Replay   string `json:"replay_endpoint"`
		Topic    string `json:"topic"`
	}
	cfg := config{Pub: "zmq", Endpoint: pub, Replay: replay, Topic: KVEventsTopic}
	if vllm {
		cfg.Enable = ptr.To(true)
	}
	b, _ := json.Marshal(cfg)
	return string(b)
}

// PrefixCachingOn reports whether vLLM's prefix caching stays on for
// cmdline: on unless the last of --enable-prefix-caching and
// --no-enable-prefix-caching (argparse's BooleanOptionalAction, in any
// spelling vLLM's parser reads) is the negative one. vLLM enables it by
// default for generative models.
func PrefixCachingOn(cmdline []string) bool {
	on := true
	for _, a := range cmdline {
		if a == "--" {
			break
		}
		key, _, _ := strings.Cut(a, "=")
		switch {
		case SpellsFlag(key, "--no-enable-prefix-caching", true):
			on = false
		case SpellsFlag(key, "--enable-prefix-caching", true):
			on = true
		}
	}
	return on
}

// DataParallelSize reads the number of data-parallel ranks an engine runs
// in this pod, each with its own publisher: vLLM --data-parallel-size
// (-dp), SGLang --dp-size (--dp, --data-parallel-size). It is 1 when none
// is set. ok is false when the webhook cannot follow the ranks: a size
// that is not an integer from 1 to 1024, a size set twice, or multi-node
// flags (vLLM --data-parallel-size-local/-dpl, --data-parallel-start-rank/
// -dpr, --data-parallel-rank/-dpn; SGLang --node-rank), with which this
// pod's ranks need not start at 0.
func DataParallelSize(cmdline []string, rt v1alpha1.Runtime) (int, bool) {
	var values []string
	multiNode := false
	if rt == v1alpha1.RuntimeSGLang {
		for _, name := range []string{"--dp-size", "--data-parallel-size"} {
			values = append(values, flagValues(cmdline, name, true)...)
		}
		values = append(values, flagValues(cmdline, "--dp", false)...)
		multiNode = len(FlagUses(cmdline, "--node-rank", true)) > 0
	} else {
		values = append(values, flagValues(cmdline, "--data-parallel-size", false)...)
		values = append(values, shortValues(cmdline, "-dp")...)
		// vLLM's parser takes a unique prefix of a long flag for the flag
		// (--data-parallel-start 2). --data-parallel-size is a flag of its
		// own and a prefix of --data-parallel-size-local: its exact uses
		// are not the local size.
		local := len(FlagUses(cmdline, "--data-parallel-size-local", true)) - len(FlagUses(cmdline, "--data-parallel-size", false))
		multiNode = local > 0
		for _, name := range []string{"--data-parallel-start-rank", "--data-parallel-rank"} {
			multiNode = multiNode || len(FlagUses(cmdline, name, true)) > 0
		}
		for _, short := range []string{"-dpl", "-dpr", "-dpn"} {
			multiNode = multiNode || len(shortValues(cmdline, short)) > 0
		}
	}
	if multiNode || len(values) > 1 {
		return 0, false
	}
	if len(values) == 0 {
		return 1, true
	}
	n, err := strconv.Atoi(values[0])
	if err != nil || n < 1 || n > maxDataParallel {
		return 0, false
	}
	return n, true
}

func flagValues(cmdline []string, name string, abbrev bool) []string {
	var out []string
	for _, u := range FlagUses(cmdline, name, abbrev) {
		out = append(out, u.Value)
	}
	return out
}

// shortValues returns the values of a single-dash option (-dp 2, -dp=2).
func shortValues(cmdline []string, opt string) []string {
	var out []string
	for i := 0; i < len(cmdline); i++ {
		a := cmdline[i]
		if a == "--" {
			break
		}
		switch {
		case a == opt && i+1 < len(cmdline):
			out = append(out, cmdline[i+1])
			i++
		case a == opt:
			out = append(out, "")
		case strings.HasPrefix(a, opt+"="):
			out = append(out, strings.TrimPrefix(a, opt+"="))
		}
	}
	return out
}

// lastValue is the value of the last use of a flag when it is a positive
// integer (the block or page size the engine hashes with), else "".
func lastValue(cmdline []string, name string, abbrev bool) string {
	uses := FlagUses(cmdline, name, abbrev)
	if len(uses) == 0 {
		return ""
	}
	if n, err := strconv.Atoi(uses[len(uses)-1].Value); err == nil && n > 0 {
		return strconv.Itoa(n)
	}
	return ""
}

// namesTaken names a container or volume of pod that has a name the
// wiring adds but is not what the wiring adds, or "". A pod admitted twice
// (webhook reinvocation) keeps its sidecar: an init container of that name
// running the same image as a native sidecar, and a token volume of the
// index's audience, are the webhook's own (the API server may have
// defaulted their other fields since).
func namesTaken(pod *corev1.Pod, w *KVEventsWiring) string {
	taken := slices.ContainsFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == SubscriberContainer }) ||
		slices.ContainsFunc(pod.Spec.InitContainers, func(c corev1.Container) bool {
			return c.Name == SubscriberContainer && (c.Image != w.Sidecar.Image || !equality.Semantic.DeepEqual(c.RestartPolicy, w.Sidecar.RestartPolicy))
		})
	if taken {
		return fmt.Sprintf("container named %q", SubscriberContainer)
	}
	for _, v := range pod.Spec.Volumes {
		want := slices.IndexFunc(w.Volumes, func(x corev1.Volume) bool { return x.Name == v.Name })
		switch {
		case v.Name == v1alpha1.VolumeIndexToken && (want < 0 || !sameTokenSource(v, w.Volumes[want])):
			return fmt.Sprintf("volume named %q", v1alpha1.VolumeIndexToken)
		case v.Name == v1alpha1.VolumeNoAPIToken && (v.EmptyDir == nil || v.EmptyDir.Medium != "" || v.EmptyDir.SizeLimit != nil):
			return fmt.Sprintf("volume named %q", v1alpha1.VolumeNoAPIToken)
		}
	}
	return ""
}

// ServiceAccountTokenDir is where the API server's ServiceAccount
// admission mounts a pod's API token into its containers.
const ServiceAccountTokenDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// DefaultPullPolicy is the imagePullPolicy the API server gives a
// container of this image that sets none (SetDefaults_Container): Always
// for the tag latest, or no tag and no digest; IfNotPresent otherwise.
func DefaultPullPolicy(image string) corev1.PullPolicy {
	_, tag, digest := imageref.Split(image)
	if tag == "latest" || tag == "" && digest == "" {
		return corev1.PullAlways
	}
	return corev1.PullIfNotPresent
}

// sameTokenSource reports whether two projected volumes hold one token of
// the same audience at the same path.
func sameTokenSource(a, b corev1.Volume) bool {
	if a.Projected == nil || b.Projected == nil || len(a.Projected.Sources) != 1 || len(b.Projected.Sources) != 1 {
		return false
	}
	x, y := a.Projected.Sources[0].ServiceAccountToken, b.Projected.Sources[0].ServiceAccountToken
	return x != nil && y != nil && x.Audience == y.Audience && x.Path == y.Path
}

func fieldEnv(name, path string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: path}}}
}

// addFlags adds each flag c's command line does not set in any spelling.
func addFlags(c *corev1.Container, flags []Flag, abbrev bool) {
	for _, f := range flags {
		if len(FlagUses(append(slices.Clone(c.Command), c.Args...), f.Name, abbrev)) > 0 {
			continue
		}
		c.Args = append(c.Args, f.Name)
		if f.Value != "" {
			c.Args = append(c.Args, f.Value)
		}
	}
}
