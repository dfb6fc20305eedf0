package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/lmcacheproto"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/test/controlplane"
	"github.com/inferencecache/operator/test/testutil/realnode"
)

// realWorkDir is the real-node demo's folder (kept short: containerd's
// socket lives in it).
const realWorkDir = ".localcluster-real"

// demoRealNode is `make demo NODE=real`: the quickstart on a real node
// (test/testutil/realnode), in the foreground. The operator runs from the
// install bundle and the project's own images, the quickstart's managed
// LMCache server from the engine image built from the locked vllm
// environment (vLLM 0.33 and LMCache 0.5.6, under LMCache's image name),
// and the quickstart's engine Deployment with its container replaced by
// the stand-in engine of that image (no GPU here: vLLM's own parser takes
// the wired command line and the engine reaches the server by DNS). It
// waits for an interrupt, then tears everything down and checks that the
// host is as it was.
func demoRealNode(ctx context.Context) (err error) {
	if os.Geteuid() != 0 {
		return fmt.Errorf("the real node needs root (namespaces, cgroups, mounts)")
	}
	cp, err := controlplane.Dir()
	if err != nil {
		return err
	}
	nodeDir, err := realnode.Dir()
	if err != nil {
		return err
	}
	say("the vllm Python environment (vLLM, LMCache; test/tools/python), built if missing")
	py := exec.CommandContext(ctx, "bash", "test/tools/install-python.sh", "vllm")
	py.Stderr = os.Stderr
	out, err := py.Output()
	if err != nil {
		return fmt.Errorf("building the vllm environment: %w", err)
	}
	pyEnv := strings.TrimSpace(string(out))

	wd := abs(realWorkDir)
	if err := os.RemoveAll(wd); err != nil {
		return err
	}
	say("starting a local control plane and a real node (kubelet, containerd, kube-proxy, CoreDNS) in a network namespace of their own; logs in %s/n", realWorkDir)
	node, bundle, err := realnode.StartWithBundle(ctx, abs("."), filepath.Join(wd, "images"), "dev", realnode.Options{
		ControlPlaneDir: cp, NodeDir: nodeDir, WorkDir: filepath.Join(wd, "n"), Log: func(f string, a ...any) { say(f, a...) },
	})
	if err != nil {
		return err
	}
	defer func() {
		say("stopping the node and the control plane")
		stopErr := node.Stop()
		// The images and containerd's store are gigabytes; the logs stay.
		_ = os.RemoveAll(filepath.Join(wd, "images"))
		_ = os.RemoveAll(filepath.Join(wd, "n", "containerd"))
		if stopErr != nil {
			err = fmt.Errorf("teardown: %w", stopErr)
			return
		}
		say("stopped; the host's links, routes, iptables rules, mounts, sysctls and cgroups are as they were")
	}()

	kubectl := func(args ...string) error {
		fmt.Printf("$ kubectl %s\n", strings.Join(args, " "))
		cmd := exec.CommandContext(ctx, filepath.Join(cp, "kubectl"), append([]string{"--kubeconfig", node.Cluster.Kubeconfig}, args...)...)
		node.Enter(cmd)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		return cmd.Run()
	}
	say("installing the operator from its dev bundle (the project's images, pinned by digest)")
	if err := kubectl("apply", "--server-side", "-f", bundle); err != nil {
		return err
	}
	if err := kubectl("-n", "inferencecache-system", "wait", "--for=condition=Available", "deployment", "--all", "--timeout=300s"); err != nil {
		return err
	}
	say("building (once) and importing the engine image %s from %s", render.DefaultImage, pyEnv)
	start := time.Now()
	if err := node.ImportEngineImage(ctx, pyEnv, realnode.ImagesCacheDir(), render.DefaultImage); err != nil {
		return err
	}
	say("engine image ready in %s", time.Since(start).Round(time.Second))

	say("applying the CacheBackend of %s: the operator runs its LMCache server for real", examples)
	if err := kubectl("apply", "--server-side", "-f", abs(examples+"/cachebackend.yaml")); err != nil {
		return err
	}
	if err := kubectl("wait", "--for=condition=Ready", "cachebackend/"+backend, "--timeout=300s"); err != nil {
		return err
	}
	engine, err := standInEngine(examples + "/engine.yaml")
	if err != nil {
		return err
	}
	path := filepath.Join(wd, "engine.yaml")
	if err := os.WriteFile(path, engine, 0o644); err != nil {
		return err
	}
	say("applying the engine of %s, its container replaced by the stand-in engine (%s)", examples, path)
	if err := kubectl("apply", "--server-side", "-f", path); err != nil {
		return err
	}
	if err := kubectl("rollout", "status", "deployment/qwen-engine", "--timeout=300s"); err != nil {
		return err
	}
	for _, args := range [][]string{
		{"get", "cachebackend", backend, "-o", "wide"},
		{"get", "deployment,service,pods", "-o", "wide"},
		{"logs", "-l", "app=qwen-demo", "-c", "vllm", "--tail=-1"},
	} {
		if err := kubectl(args...); err != nil {
			return err
		}
	}
	fmt.Printf(`
CacheBackend %s is Ready on a real node; its server pod and the wired engine pod run in containerd.

The node runs in a network namespace of its own; reach it from another shell with:
  %s %s --kubeconfig %s get pods -A
Press Ctrl-C to stop it (the host is checked unchanged).
`, backend, node.EnterCommand(), filepath.Join(cp, "kubectl"), node.Cluster.Kubeconfig)
	if os.Getenv("DEMO_EXIT") == "" {
		<-ctx.Done()
	}
	return nil
}

// standInEngine is the Deployment of the engine file f with its first
// container running the stand-in engine (realnode.EngineProgram) of the
// engine image, as test/realnode's engines do.
func standInEngine(f string) ([]byte, error) {
	b, err := os.ReadFile(f)
	if err != nil {
		return nil, err
	}
	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict(b, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", f, err)
	}
	c := &d.Spec.Template.Spec.Containers[0]
	s := realnode.StandInEngine(render.DefaultImage, corev1.EnvVar{Name: "PROBE", Value: lmcacheproto.ProbeScript()})
	c.Image, c.Command, c.Env, c.ReadinessProbe = s.Image, s.Command, append(c.Env, s.Env...), s.ReadinessProbe
	if d.Spec.Template.Annotations == nil {
		d.Spec.Template.Annotations = map[string]string{}
	}
	d.Spec.Template.Annotations[v1alpha1.AnnotationVLLMVersion] = "0.33.0"
	return yaml.Marshal(&d)
}
