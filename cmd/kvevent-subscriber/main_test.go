package main

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/inject/injecttest"
)

func TestOffsetEndpoint(t *testing.T) {
	for _, tc := range []struct {
		ep   string
		rank int
		want string
		err  bool
	}{
		{"tcp://127.0.0.1:5557", 0, "tcp://127.0.0.1:5557", false},
		{"tcp://127.0.0.1:5557", 3, "tcp://127.0.0.1:5560", false},
		{"tcp://[::1]:5557", 1, "tcp://[::1]:5558", false},
		{"ipc:///var/run/kvevents/pub.sock", 0, "ipc:///var/run/kvevents/pub.sock", false},
		{"ipc:///var/run/kvevents/pub.sock", 1, "", true},
		{"tcp://127.0.0.1", 1, "", true},
	} {
		got, err := offsetEndpoint(tc.ep, tc.rank)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("offsetEndpoint(%q, %d) = %q, %v; want %q, error %v", tc.ep, tc.rank, got, err, tc.want, tc.err)
		}
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--engine", "trtllm"},
		{"--data-parallel-size", "0"},
		{"--data-parallel-size", "2", "--endpoint", "ipc:///tmp/x.sock"},
	} {
		err := run(context.Background(), args)
		if err == nil || strings.ToLower(err.Error()[:1]) != err.Error()[:1] {
			t.Errorf("run(%v) = %v, want a lower-case error", args, err)
		}
	}
}

// TestQueueFitsTheSidecarLimit: the default payload queue takes at most a
// quarter of the memory limit the webhook gives the sidecar (issue 25: it
// was 256 MiB against a 128 MiB limit, so a burst the queue admitted got
// the sidecar OOM-killed instead of dropped and replayed).
func TestQueueFitsTheSidecarLimit(t *testing.T) {
	cb := injecttest.Backend("cache", func(cb *v1alpha1.CacheBackend) {
		cb.Spec.Observation = &v1alpha1.Observation{ModelID: "qwen"}
	})
	d := inject.Decide(injecttest.EnginePod(), []v1alpha1.CacheBackend{cb}, inject.Options{KVEventSubscriberImage: "sub:v1"})
	i := slices.IndexFunc(d.Pod.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == inject.SubscriberContainer })
	if i < 0 {
		t.Fatalf("no sidecar injected: %s", d.Message)
	}
	limit := d.Pod.Spec.InitContainers[i].Resources.Limits.Memory().Value()
	if limit == 0 || defaultQueueBytes > limit/4 {
		t.Fatalf("--queue-bytes defaults to %d bytes; the sidecar's memory limit is %d", defaultQueueBytes, limit)
	}
}

// TestWorkerURL: the URL SGLang's router names a worker by
// (http://host:port; URL syntax, RFC 3986, puts an IPv6 host in brackets)
// built from the pod's IP and SGLang's port; an explicit --worker-address wins, and
// with a part missing the sidecar sends none.
func TestWorkerURL(t *testing.T) {
	for _, tc := range []struct{ address, ip, port, want string }{
		{"", "10.0.3.7", "30000", "http://10.0.3.7:30000"},
		{"", "fd00:10:244::7", "30000", "http://[fd00:10:244::7]:30000"},
		{"http://sglang-0.sglang:8080", "10.0.3.7", "30000", "http://sglang-0.sglang:8080"},
		{"", "", "30000", ""},
		{"", "10.0.3.7", "", ""},
	} {
		if got := workerURL(tc.address, tc.ip, tc.port); got != tc.want {
			t.Errorf("workerURL(%q, %q, %q) = %q, want %q", tc.address, tc.ip, tc.port, got, tc.want)
		}
	}
}
