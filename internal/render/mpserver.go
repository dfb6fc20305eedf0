package render

import (
	"encoding/json"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/topology"
)

// MPServer is a multiprocess-mode LMCache server (`lmcache server`, LMCache
// 0.5.6) as the operator runs it on each node (docs/design/multiprocess-mode.md):
// what MPServerFor reads from spec.multiprocess, and what test/conformance
// starts the installed LMCache with.
type MPServer struct {
	// Port is the ZMQ request port (--port), on every address of the pod;
	// HTTPPort the health, metrics and admin port (--http-port), on the
	// pod's loopback only (MPServerArgs), and the metrics gate's port on
	// the pod's IP (MPMetricsGate).
	Port, HTTPPort int32
	// L1SizeGiB is the host-memory tier (--l1-size-gb), > 0.
	L1SizeGiB int32
	// EvictionPolicy is LRU, ARC or IsolatedLRU; WatermarkPercent and
	// RatioPercent (1 to 100) are --eviction-trigger-watermark and
	// --eviction-ratio in hundredths (LMCache accepts any float there, 1.5
	// and -1 too: the CRD bounds them).
	EvictionPolicy                 string
	WatermarkPercent, RatioPercent int32
	// RESP is a Redis or Valkey L2 tier, Disk a local-disk one (fs_native).
	RESP *MPRESP
	Disk *MPDisk
}

// MPRESP is an L2 tier over RESP (LMCache's resp adapter; no TLS), tested
// against redis-server; Valkey speaks the same protocol.
type MPRESP struct {
	Host        string
	Port        int32
	CapacityGiB int32
	// Credentials names the Secret whose keys UsernameKey and PasswordKey
	// hold the credentials, "" for none. They reach the server as
	// LMCACHE_RESP_USERNAME and LMCACHE_RESP_PASSWORD, never in the
	// adapter's JSON: the server echoes that JSON at its unauthenticated
	// GET /config.
	Credentials              string
	UsernameKey, PasswordKey string
}

// MPDisk is an L2 tier on a local folder (LMCache's fs_native adapter),
// bounded: fs_native enforces max_capacity_gb only with an eviction block,
// which is always rendered.
type MPDisk struct {
	Path        string
	CapacityGiB int32
	// StorageClassName of the ephemeral volume's claim (nil: the
	// cluster's default class).
	StorageClassName *string
}

// Defaults of spec.multiprocess that the CRD also sets; MPServerFor uses
// them for an object read without the schema's defaults.
const (
	DefaultMPHTTPPort = int32(8080)
	DefaultMPDiskPath = "/var/lib/lmcache"
	// MPWorkerReapSeconds is --worker-reap-timeout-seconds: the server
	// forgets an engine whose heartbeats stopped after this long (LMCache's
	// default is 120; it refuses less than 30 but 0, and wants at least 3
	// heartbeats of 10 s): a replaced engine's registration goes sooner.
	MPWorkerReapSeconds = 30
)

// MPServerFor is the MP server cb's spec.multiprocess asks for (the zero
// MPServer when it has none). Sizes are whole GiB (the validating webhook
// refuses others; a fraction is dropped).
func MPServerFor(cb *v1alpha1.CacheBackend) MPServer {
	mp := cb.Spec.Multiprocess
	if mp == nil {
		return MPServer{}
	}
	s := MPServer{
		Port: orDefault(mp.Port, topology.DefaultMPPort), HTTPPort: orDefault(mp.HTTPPort, DefaultMPHTTPPort),
		L1SizeGiB:        gib(mp.L1.Size),
		EvictionPolicy:   string(mp.L1.EvictionPolicy),
		WatermarkPercent: orDefault(mp.L1.EvictionWatermarkPercent, 80),
		RatioPercent:     orDefault(mp.L1.EvictionRatioPercent, 20),
	}
	if s.EvictionPolicy == "" {
		s.EvictionPolicy = string(v1alpha1.MPEvictionLRU)
	}
	if l2 := mp.L2; l2 != nil {
		if r := l2.RESP; r != nil {
			s.RESP = &MPRESP{Host: r.Host, Port: orDefault(r.Port, 6379), CapacityGiB: gib(r.Capacity)}
			if c := r.CredentialsSecretRef; c != nil {
				s.RESP.Credentials, s.RESP.UsernameKey, s.RESP.PasswordKey = c.Name, c.UsernameKey, c.PasswordKey
				if s.RESP.PasswordKey == "" {
					s.RESP.PasswordKey = "password"
				}
			}
		}
		if d := l2.Disk; d != nil {
			s.Disk = &MPDisk{Path: d.Path, CapacityGiB: gib(d.Capacity), StorageClassName: d.StorageClassName}
			if s.Disk.Path == "" {
				s.Disk.Path = DefaultMPDiskPath
			}
		}
	}
	return s
}

func orDefault(v, d int32) int32 {
	if v == 0 {
		return d
	}
	return v
}

func gib(q resource.Quantity) int32 { return int32(q.Value() >> 30) }

// MPServerCommand is the MP server's command, LMCache's `lmcache` console
// script (lmcache.cli.main:main) with its `server` subcommand.
var MPServerCommand = []string{"lmcache", "server"}

// MPHealthPath is the MP server's health endpoint on its HTTP port: 200
// once its ZMQ server and engine are up, 503 before.
const MPHealthPath = "/healthcheck"

// MPMetricsPath is where the MP server's HTTP port serves its Prometheus
// series (lmcache_mp_*).
const MPMetricsPath = "/metrics"

// MPServerArgs are the arguments of MPServerCommand for s. The ZMQ port
// listens on every address of the pod (the engines of the node reach it
// through the node-local Service); the HTTP port on the pod's loopback
// only, LMCache's own default: it is LMCache's unauthenticated admin API
// (GET /env returns the process environment, the RESP password included;
// /config, /reconfigure, /cache/clear, quotas, ...), so no other pod may
// reach it. The kubelet reaches /healthcheck by an exec probe inside the
// container (MPProbe), Prometheus reaches /metrics through the metrics
// gate (MPMetricsGate). L1's size and eviction policy are always given
// (without them the server exits: "Legacy L1 configuration requires
// --l1-size-gb and --eviction-policy"), and IPC is isolated.
func MPServerArgs(s MPServer) []string {
	args := []string{
		"--host", "0.0.0.0", "--port", strconv.Itoa(int(s.Port)),
		"--http-host", MPHTTPHost, "--http-port", strconv.Itoa(int(s.HTTPPort)),
		"--l1-size-gb", strconv.Itoa(int(s.L1SizeGiB)),
		"--eviction-policy", s.EvictionPolicy,
		"--eviction-trigger-watermark", hundredths(s.WatermarkPercent),
		"--eviction-ratio", hundredths(s.RatioPercent),
		"--hash-algorithm", "blake3",
		"--worker-reap-timeout-seconds", strconv.Itoa(MPWorkerReapSeconds),
		// Isolated IPC: KV crosses by CUDA IPC handles, so neither pod
		// needs hostIPC or the host's /dev/shm (Pod Security baseline
		// refuses both). The engines' lmcache.mp.isolated_ipc must match
		// (inject.MPKVTransferConfig).
		"--isolated-ipc",
	}
	if r := s.RESP; r != nil {
		args = append(args, "--l2-adapter", mustJSON(map[string]any{
			"type": "resp", "host": r.Host, "port": r.Port, "max_capacity_gb": r.CapacityGiB,
		}))
	}
	if d := s.Disk; d != nil {
		args = append(args, "--l2-adapter", mustJSON(map[string]any{
			"type": "fs_native", "base_path": d.Path, "max_capacity_gb": d.CapacityGiB,
			"eviction": map[string]any{
				"eviction_policy":   s.EvictionPolicy,
				"trigger_watermark": json.Number(hundredths(s.WatermarkPercent)),
				"eviction_ratio":    json.Number(hundredths(s.RatioPercent)),
			},
		}))
	}
	return args
}

// MPServerEnv is the MP server container's environment: LMCache's usage
// reporting off, and the RESP credentials from their Secret.
func MPServerEnv(s MPServer) []*corev1ac.EnvVarApplyConfiguration {
	env := []*corev1ac.EnvVarApplyConfiguration{corev1ac.EnvVar().WithName("LMCACHE_TRACK_USAGE").WithValue("false")}
	if r := s.RESP; r != nil && r.Credentials != "" {
		for _, kv := range [][2]string{{"LMCACHE_RESP_USERNAME", r.UsernameKey}, {"LMCACHE_RESP_PASSWORD", r.PasswordKey}} {
			if kv[1] == "" {
				continue
			}
			env = append(env, corev1ac.EnvVar().WithName(kv[0]).WithValueFrom(corev1ac.EnvVarSource().
				WithSecretKeyRef(corev1ac.SecretKeySelector().WithName(r.Credentials).WithKey(kv[1]))))
		}
	}
	return env
}

// MPHTTPHost is where the MP server's HTTP port listens: the pod's
// loopback.
const MPHTTPHost = "127.0.0.1"

// MPProbe is the MP server's startup, readiness and liveness probe: GET
// MPHealthPath on the loopback HTTP port, from inside the container (an
// exec probe: the kubelet's HTTP probes dial the pod's IP, where the admin
// API no longer listens). It runs the image's python3 in isolated mode
// without site-packages (the standard library's urllib only, about 60 ms
// of CPU a probe on this project's machines; importing lmcache to PING
// would cost seconds): a 503 or no answer within 2 s raises, and the probe
// fails. The server's health so depends on its own container only, never
// on the metrics gate.
func MPProbe(s MPServer) *corev1ac.ProbeApplyConfiguration {
	return corev1ac.Probe().
		WithExec(corev1ac.ExecAction().WithCommand(MPProbeCommand(s)...)).
		WithPeriodSeconds(10).WithTimeoutSeconds(3).WithFailureThreshold(3)
}

// MPProbeCommand is MPProbe's command.
func MPProbeCommand(s MPServer) []string {
	return []string{"python3", "-I", "-S", "-c", fmt.Sprintf(
		"import urllib.request as u; u.urlopen('http://%s:%d%s', timeout=2)", MPHTTPHost, s.HTTPPort, MPHealthPath)}
}

// mpGateScript is the metrics gate: an HTTP server on the pod's IP
// (POD_IP) at the HTTP port (argv[2]) that answers GET MPMetricsPath (a
// query string aside) with the server's own /metrics from its loopback
// port (argv[1]), at most 16 MiB of it, and every other path 404, every
// other method 501 (http.server's own answer); an upstream error is a
// 502. It forwards no request header and keeps no state; a client idle
// for 5 s is dropped. Python's standard library only, run by the server
// image's python3, so the gate needs no image of its own.
const mpGateScript = `import http.server as s, os, socket, sys, urllib.request as u
up = "http://127.0.0.1:%s/metrics" % sys.argv[1]
class H(s.BaseHTTPRequestHandler):
    timeout = 5
    def do_GET(self):
        if self.path.split("?", 1)[0] != "/metrics":
            return self.send_error(404)
        try:
            with u.urlopen(up, timeout=5) as r:
                body, kind = r.read(16 << 20), r.headers.get("Content-Type", "text/plain")
        except Exception:
            return self.send_error(502)
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
ip = os.environ["POD_IP"]
class S(s.ThreadingHTTPServer):
    address_family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    daemon_threads = True
S((ip, int(sys.argv[2])), H).serve_forever()
`

// MPMetricsGate is the MP server pod's metrics gate, a native sidecar of
// the server's image: Prometheus (the monitoring component's PodMonitor,
// by port name MPHTTPPortName) scrapes MPMetricsPath at the pod's IP and
// HTTP port, and reaches nothing else of the admin API. Binding the pod's
// IP, not 0.0.0.0, lets it share the port number with the server's
// loopback listener. Its resources are small and its own: a flood of
// scrapes ends in this container, never in the server's.
func MPMetricsGate(image string, s MPServer) *corev1ac.ContainerApplyConfiguration {
	port := strconv.Itoa(int(s.HTTPPort))
	return corev1ac.Container().
		WithName(MPGateContainerName).
		WithImage(image).
		WithRestartPolicy(corev1.ContainerRestartPolicyAlways).
		WithCommand("python3", "-I", "-S", "-c", mpGateScript, port, port).
		WithEnv(corev1ac.EnvVar().WithName("POD_IP").WithValueFrom(corev1ac.EnvVarSource().
			WithFieldRef(corev1ac.ObjectFieldSelector().WithFieldPath("status.podIP")))).
		WithPorts(corev1ac.ContainerPort().WithName(MPHTTPPortName).WithContainerPort(s.HTTPPort).WithProtocol(corev1.ProtocolTCP)).
		WithResources(corev1ac.ResourceRequirements().
			WithRequests(corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")}).
			WithLimits(corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}))
}

// hundredths is p/100 as LMCache parses a float: "0.8", "1", "0.05".
func hundredths(p int32) string {
	return strconv.FormatFloat(float64(p)/100, 'f', -1, 64)
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // maps of strings and numbers always marshal
	}
	return string(b)
}

// Names of the MP server's ports, container and L2 disk volume.
const (
	mpContainerName = "lmcache-mp-server"
	mpPortName      = "zmq"
	// MPGateContainerName is the metrics gate's container (MPMetricsGate).
	MPGateContainerName = "metrics-gate"
	// MPHTTPPortName names the metrics gate's port, where the monitoring
	// component's PodMonitor inferencecache-lmcache-mp scrapes
	// MPMetricsPath by this name.
	MPHTTPPortName = "http"
	// MPDiskVolumeName is the generic ephemeral volume of the disk tier.
	MPDiskVolumeName = "l2-disk"
)

// MPResources are the MP server container's resources: memory requests
// L1 + 5 GiB (the server's own overhead beside its host-memory tier) and
// a limit of 1.5 times that, rounded up to whole GiB; 4 CPUs requested.
// The LMCache operator's formula, kept so that users moving over see the
// same numbers.
func MPResources(s MPServer) *corev1ac.ResourceRequirementsApplyConfiguration {
	req := int64(s.L1SizeGiB) + 5
	limit := (req*3 + 1) / 2 // ceil(1.5 × req)
	return corev1ac.ResourceRequirements().
		WithRequests(corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("4"),
			corev1.ResourceMemory: *resource.NewQuantity(req<<30, resource.BinarySI),
		}).
		WithLimits(corev1.ResourceList{corev1.ResourceMemory: *resource.NewQuantity(limit<<30, resource.BinarySI)})
}

// MPDaemonSet is cb's MP server workload for s: one pod per node the
// server pod's placement (spec.remoteStorage.lmCacheServer.pod) selects,
// with the hardened pod defaults of every server the operator creates
// (ServerPodDefaults, the scratch space), the rendered probes (a startup
// probe gives a cold start five minutes), and, with a disk tier, a generic
// ephemeral volume of storageClass at the tier's path (a DaemonSet's one
// template cannot name a claim per node, and Pod Security baseline
// refuses hostPath: the disk tier starts empty when its pod is replaced).
func MPDaemonSet(cb *v1alpha1.CacheBackend, s MPServer) *appsv1ac.DaemonSetApplyConfiguration {
	probe := func() *corev1ac.ProbeApplyConfiguration { return MPProbe(s) }
	image, resources := ServerImage(cb), MPResources(s)
	if srv := server(cb); srv != nil {
		if r := srv.Resources; r != nil {
			resources = corev1ac.ResourceRequirements()
			if len(r.Requests) > 0 {
				resources.WithRequests(r.Requests)
			}
			if len(r.Limits) > 0 {
				resources.WithLimits(r.Limits)
			}
		}
	}
	container := corev1ac.Container().
		WithName(mpContainerName).
		WithImage(image).
		WithCommand(MPServerCommand...).
		WithArgs(MPServerArgs(s)...).
		WithEnv(MPServerEnv(s)...).
		WithPorts(corev1ac.ContainerPort().WithName(mpPortName).WithContainerPort(s.Port).WithProtocol(corev1.ProtocolTCP)).
		WithStartupProbe(probe().WithFailureThreshold(30)).
		WithReadinessProbe(probe()).
		WithLivenessProbe(probe()).
		WithResources(resources)
	podSpec := corev1ac.PodSpec()
	if d := s.Disk; d != nil {
		claim := corev1ac.PersistentVolumeClaimSpec().
			WithAccessModes(corev1.ReadWriteOnce).
			WithResources(corev1ac.VolumeResourceRequirements().WithRequests(corev1.ResourceList{
				corev1.ResourceStorage: *resource.NewQuantity(int64(d.CapacityGiB)<<30, resource.BinarySI)}))
		if d.StorageClassName != nil {
			claim.WithStorageClassName(*d.StorageClassName)
		}
		podSpec.WithVolumes(corev1ac.Volume().WithName(MPDiskVolumeName).
			WithEphemeral(corev1ac.EphemeralVolumeSource().WithVolumeClaimTemplate(
				corev1ac.PersistentVolumeClaimTemplate().WithSpec(claim))))
		container.WithVolumeMounts(corev1ac.VolumeMount().WithName(MPDiskVolumeName).WithMountPath(d.Path))
	}
	scratch(podSpec, container)
	tmpl := serverTemplate(cb, ServerPodDefaults(serverPod(cb)), podSpec, container)
	// The gate runs with the server container's hardening (and its
	// identity, from the pod).
	tmpl.Spec.WithInitContainers(MPMetricsGate(image, s).WithSecurityContext(container.SecurityContext))
	return appsv1ac.DaemonSet(cb.Name, cb.Namespace).
		WithLabels(objectLabels(cb)).
		WithAnnotations(workloadAnnotations(Options{})).
		WithOwnerReferences(ownerRef(cb)).
		WithSpec(appsv1ac.DaemonSetSpec().
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(SelectorLabels(cb))).
			WithTemplate(tmpl))
}

// MPService is cb's node-local Service for s: each engine pod reaches the
// server of its own node, or none (internalTrafficPolicy Local: there is
// no fallback to another node's server, whose CUDA IPC could not reach the
// engine's GPU memory). It serves the ZMQ port only: the HTTP port is
// LMCache's unauthenticated admin API (GET /config, /reconfigure, ...),
// which listens on the pods' loopback only (the kubelet probes inside the
// container, Prometheus scrapes the pods' metrics gate).
func MPService(cb *v1alpha1.CacheBackend, s MPServer) *corev1ac.ServiceApplyConfiguration {
	return corev1ac.Service(topology.ServiceName(cb), cb.Namespace).
		WithLabels(objectLabels(cb)).
		WithOwnerReferences(ownerRef(cb)).
		WithSpec(corev1ac.ServiceSpec().
			WithType(corev1.ServiceTypeClusterIP).
			WithInternalTrafficPolicy(corev1.ServiceInternalTrafficPolicyLocal).
			WithSelector(SelectorLabels(cb)).
			WithPorts(
				corev1ac.ServicePort().WithName(mpPortName).WithPort(s.Port).WithTargetPort(intstr.FromString(mpPortName)).WithProtocol(corev1.ProtocolTCP)))
}
