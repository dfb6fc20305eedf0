package render

import (
	"encoding/json"
	"strconv"

	"k8s.io/apimachinery/pkg/util/intstr"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
)

// MPServer is a multiprocess-mode LMCache server (`lmcache server`, LMCache
// 0.5.6) as the operator is to run it on each node (issue 23,
// docs/design/multiprocess-mode.md). No CacheBackend field builds one yet:
// it is the shape the API will carry, and what test/conformance starts the
// installed LMCache with.
type MPServer struct {
	// Port is the ZMQ request port (--port), HTTPPort the health, metrics
	// and admin port (--http-port).
	Port, HTTPPort int32
	// L1SizeGiB is the host-memory tier (--l1-size-gb), > 0.
	L1SizeGiB int32
	// EvictionPolicy is LRU, ARC or IsolatedLRU; WatermarkPercent and
	// RatioPercent (1 to 100) are --eviction-trigger-watermark and
	// --eviction-ratio in hundredths (LMCache accepts any float there, 1.5
	// and -1 too, so the operator bounds them).
	EvictionPolicy                 string
	WatermarkPercent, RatioPercent int32
	// RESP is a Redis or Valkey L2 tier, Disk a local-disk one (fs_native).
	RESP *MPRESP
	Disk *MPDisk
}

// MPRESP is an L2 tier over RESP (LMCache's resp adapter; no TLS).
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
}

// MPServerCommand is the MP server's command, LMCache's `lmcache` console
// script (lmcache.cli.main:main) with its `server` subcommand.
var MPServerCommand = []string{"lmcache", "server"}

// MPHealthPath is the MP server's health endpoint on its HTTP port: 200
// once its ZMQ server and engine are up, 503 before.
const MPHealthPath = "/healthcheck"

// MPServerArgs are the arguments of MPServerCommand for s. Both listen
// addresses are 0.0.0.0 (LMCache's defaults are loopback only), and L1's
// size and eviction policy are always given (without them the server
// exits: "Legacy L1 configuration requires --l1-size-gb and
// --eviction-policy").
func MPServerArgs(s MPServer) []string {
	args := []string{
		"--host", "0.0.0.0", "--port", strconv.Itoa(int(s.Port)),
		"--http-host", "0.0.0.0", "--http-port", strconv.Itoa(int(s.HTTPPort)),
		"--l1-size-gb", strconv.Itoa(int(s.L1SizeGiB)),
		"--eviction-policy", s.EvictionPolicy,
		"--eviction-trigger-watermark", hundredths(s.WatermarkPercent),
		"--eviction-ratio", hundredths(s.RatioPercent),
		"--hash-algorithm", "blake3",
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

// MPProbe is the MP server's readiness and liveness probe: GET
// MPHealthPath on its HTTP port (no exec: a PING from Python costs seconds
// of CPU each time).
func MPProbe(s MPServer) *corev1ac.ProbeApplyConfiguration {
	return corev1ac.Probe().
		WithHTTPGet(corev1ac.HTTPGetAction().WithPath(MPHealthPath).WithPort(intstr.FromInt32(s.HTTPPort))).
		WithPeriodSeconds(10).WithTimeoutSeconds(3).WithFailureThreshold(3)
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
