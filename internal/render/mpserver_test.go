package render_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"

	"github.com/inferencecache/operator/internal/render"
)

func TestMPServerArgs(t *testing.T) {
	base := render.MPServer{Port: 5555, HTTPPort: 8080, L1SizeGiB: 20, EvictionPolicy: "ARC", WatermarkPercent: 80, RatioPercent: 5}
	head := "--host 0.0.0.0 --port 5555 --http-host 127.0.0.1 --http-port 8080 --l1-size-gb 20 --eviction-policy ARC --eviction-trigger-watermark 0.8 --eviction-ratio 0.05 --hash-algorithm blake3 --worker-reap-timeout-seconds 30 --isolated-ipc"
	for _, tc := range []struct {
		name string
		mod  func(*render.MPServer)
		want string
	}{
		{"l1 only", func(*render.MPServer) {}, head},
		{"watermark 100 percent is 1", func(s *render.MPServer) { s.WatermarkPercent = 100 }, strings.Replace(head, "watermark 0.8", "watermark 1", 1)},
		{"resp: no credential in the JSON", func(s *render.MPServer) {
			s.RESP = &render.MPRESP{Host: "redis.cache.svc", Port: 6379, CapacityGiB: 100, Credentials: "auth", UsernameKey: "u", PasswordKey: "p"}
		}, head + ` --l2-adapter {"host":"redis.cache.svc","max_capacity_gb":100,"port":6379,"type":"resp"}`},
		{"disk: bounded by an eviction block", func(s *render.MPServer) { s.Disk = &render.MPDisk{Path: "/var/lib/lmcache/l2", CapacityGiB: 500} },
			head + ` --l2-adapter {"base_path":"/var/lib/lmcache/l2","eviction":{"eviction_policy":"ARC","eviction_ratio":0.05,"trigger_watermark":0.8},"max_capacity_gb":500,"type":"fs_native"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := base
			tc.mod(&s)
			assert.Equal(t, tc.want, strings.Join(render.MPServerArgs(s), " "))
		})
	}
}

func TestMPServerEnv(t *testing.T) {
	env := render.MPServerEnv(render.MPServer{RESP: &render.MPRESP{Credentials: "auth", PasswordKey: "password"}})
	got := map[string]string{}
	for _, e := range env {
		if e.Value != nil {
			got[*e.Name] = *e.Value
		} else {
			got[*e.Name] = "secret " + *e.ValueFrom.SecretKeyRef.Name + "/" + *e.ValueFrom.SecretKeyRef.Key
		}
	}
	assert.Equal(t, map[string]string{"LMCACHE_TRACK_USAGE": "false", "LMCACHE_RESP_PASSWORD": "secret auth/password"}, got, "no username key: no username variable")
}

func TestMPResources(t *testing.T) {
	for _, tc := range []struct {
		l1             int32
		request, limit string
	}{{1, "6Gi", "9Gi"}, {20, "25Gi", "38Gi"}, {95, "100Gi", "150Gi"}} {
		r := render.MPResources(render.MPServer{L1SizeGiB: tc.l1})
		mem := (*r.Requests)[corev1.ResourceMemory]
		lim := (*r.Limits)[corev1.ResourceMemory]
		assert.Equal(t, tc.request, mem.String(), "L1 %d GiB", tc.l1)
		assert.Equal(t, tc.limit, lim.String(), "L1 %d GiB: ceil(1.5 × request)", tc.l1)
	}
}
