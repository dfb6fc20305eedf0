package validation

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/inject/injecttest"
	"github.com/inferencecache/operator/test/testutil/expansion"
)

// hfSecret is the value of the engine owner's Secret-backed HF_TOKEN.
const hfSecret = "hf_the-other-teams-token"

// kubeletView is what the kubelet makes of container c's args and env
// values (pkg/kubelet/kubelet_pods.go, with its own expansion code): env
// values in order, each expanded from the ones before it and the
// service variables, a Secret's value taken as is, then the args from
// all of them. Every Secret of the pod holds hfSecret, and so does the
// service variable HF_TOKEN.
func kubeletView(c corev1.Container) (args []string, env map[string]string) {
	env = map[string]string{}
	service := map[string]string{"HF_TOKEN": hfSecret}
	for _, e := range c.Env {
		v := expansion.Expand(e.Value, expansion.MappingFuncFor(env, service))
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			v = hfSecret
		}
		env[e.Name] = v
	}
	for _, a := range c.Args {
		args = append(args, expansion.Expand(a, expansion.MappingFuncFor(env, service)))
	}
	return args, env
}

// literal is v as the kubelet passes it when no variable is defined:
// "$$" read as "$", nothing else changed.
func literal(v string) string { return expansion.Expand(v, expansion.MappingFuncFor()) }

// expandsNothing: the kubelet's expansion of v with every name defined
// is v's literal: no variable's value can enter it.
func expandsNothing(v string) bool {
	return expansion.Expand(v, func(name string) string { return "\x00" + name }) == literal(v)
}

// overrideEntry is one allow-listed override carrying value, and the field
// path of the value.
type overrideEntry struct {
	args []string
	env  []corev1.EnvVar
	path string
}

// allowListed is every allow-listed override of type t with value in it:
// each flag that takes a value, as the next argument and inline, and each
// env name.
func allowListed(t v1alpha1.BackendType, rt v1alpha1.Runtime, value string) []overrideEntry {
	const over = "spec.integration.engineOverrides."
	var out []overrideEntry
	for _, f := range inject.AllowedFlags(rt) {
		if f.Arity == inject.NoValue {
			continue
		}
		out = append(out, overrideEntry{args: []string{f.Name, value}, path: over + "args[1]"},
			overrideEntry{args: []string{f.Name + "=" + value}, path: over + "args[0]"})
	}
	for _, names := range inject.AllowedEnvNames(rt, t) {
		for _, n := range names {
			out = append(out, overrideEntry{env: []corev1.EnvVar{{Name: n, Value: value}}, path: over + "env[0].value"})
		}
	}
	return out
}

var engineTypes = []struct {
	t  v1alpha1.BackendType
	rt v1alpha1.Runtime
}{{v1alpha1.BackendTypeLMCache, v1alpha1.RuntimeVLLM}, {v1alpha1.BackendTypeSGLangHiCache, v1alpha1.RuntimeSGLang}}

// TestNoAdmittedOverrideExpandsAVariable: issue 35. Every allow-listed
// override (and the same under optIn) with a value holding $(HF_TOKEN) is
// refused with the value's field path; written $$(HF_TOKEN) it is
// admitted, and the engine container the webhook wires with it, as the
// kubelet expands it with its own code, carries the literal $(HF_TOKEN),
// never the owner's token. A CacheBackend stored before the rule wires
// only the pods that opt in to overrides outside the allow-list.
func TestNoAdmittedOverrideExpandsAVariable(t *testing.T) {
	wiredValues := map[v1alpha1.Runtime]int{}
	for _, et := range engineTypes {
		refused, admitted := allowListed(et.t, et.rt, "x-$(HF_TOKEN)"), allowListed(et.t, et.rt, "x-$$(HF_TOKEN)")
		require.NotEmpty(t, refused)
		for i, e := range refused {
			name := string(et.rt) + " " + strings.Join(e.args, " ")
			if e.env != nil {
				name = string(et.rt) + " " + e.env[0].Name
			}
			t.Run(name, func(t *testing.T) {
				for _, optIn := range []bool{false, true} {
					o, path := &v1alpha1.EngineOverrides{Args: e.args, Env: e.env}, e.path
					if optIn {
						o = &v1alpha1.EngineOverrides{OptIn: &v1alpha1.OptInOverrides{Args: e.args, Env: e.env}}
						path = strings.Replace(path, "engineOverrides.", "engineOverrides.optIn.", 1)
					}
					cb := overrides(et.t, nil)
					cb.Spec.Integration.EngineOverrides = o
					errs := Validate(cb)
					found := slices.ContainsFunc(errs, func(e *field.Error) bool {
						return e.Field == path && strings.Contains(e.Error(), "write $$( for a literal $(")
					})
					assert.True(t, found, "optIn %v: %v", optIn, errs)
				}

				// Stored before the rule: a pod that does not opt in is
				// admitted unwired, and its container keeps its own args.
				stored := injecttest.Backend("cache", func(cb *v1alpha1.CacheBackend) {
					cb.Spec.Type, cb.Spec.Runtime = et.t, et.rt
					cb.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{Args: e.args, Env: e.env}
				})
				d := inject.Decide(enginePodWithToken(e), []v1alpha1.CacheBackend{stored}, inject.Options{})
				assert.Equal(t, inject.Skipped, d.Outcome, d.Message)
				args, env := kubeletView(d.Pod.Spec.Containers[0])
				assert.NotContains(t, strings.Join(args, " "), hfSecret)
				for k, v := range env {
					if k != "HF_TOKEN" {
						assert.NotContains(t, v, hfSecret, k)
					}
				}

				// Escaped, it is admitted, wired, and stays literal.
				a := admitted[i]
				cb := overrides(et.t, nil)
				cb.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{Args: a.args, Env: a.env}
				if errs := Validate(cb); len(errs) > 0 {
					// An enumerated value (--hicache-host-memory-mode):
					// refused for what it is, not for the escape.
					assert.NotContains(t, errs.ToAggregate().Error(), "write $$( for a literal", "refused only for another reason")
					return
				}
				wiredValues[et.rt]++
				for _, v := range append(slices.Clone(a.args), envValues(a.env)...) {
					assert.True(t, expandsNothing(v), v)
				}
				wired := injecttest.Backend("cache", func(cb *v1alpha1.CacheBackend) {
					cb.Spec.Type, cb.Spec.Runtime = et.t, et.rt
					cb.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{Args: a.args, Env: a.env}
				})
				d = inject.Decide(enginePodWithToken(a), []v1alpha1.CacheBackend{wired}, inject.Options{})
				require.Equal(t, inject.Injected, d.Outcome, d.Message)
				args, env = kubeletView(d.Pod.Spec.Containers[0])
				if a.env != nil {
					assert.Equal(t, "x-$(HF_TOKEN)", env[a.env[0].Name])
				} else {
					want := literal(a.args[len(a.args)-1])
					assert.Contains(t, args, want)
				}
				assert.NotContains(t, strings.Join(args, " "), hfSecret)
			})
		}
	}
	assert.Greater(t, wiredValues[v1alpha1.RuntimeVLLM], 40, "escaped values admitted and wired")
	assert.Greater(t, wiredValues[v1alpha1.RuntimeSGLang], 20, "escaped values admitted and wired")
}

// enginePodWithToken is the engine pod with HF_TOKEN from its owner's
// Secret, unless e sets HF_TOKEN itself (the service variable HF_TOKEN
// of kubeletView holds the token then).
func enginePodWithToken(e overrideEntry) *corev1.Pod {
	return injecttest.EnginePod(func(p *corev1.Pod) {
		if len(e.env) > 0 && e.env[0].Name == "HF_TOKEN" {
			return
		}
		p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: "HF_TOKEN", ValueFrom: &corev1.EnvVarSource{
			SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "hf"}, Key: "token"}}})
	})
}

func envValues(env []corev1.EnvVar) []string {
	var out []string
	for _, e := range env {
		out = append(out, e.Value)
	}
	return out
}

// TestSpecValuesExpandNoVariable: the other values of the spec that become
// a container's argument or env value refuse an unescaped $( with their
// field path and admit $$(.
func TestSpecValuesExpandNoVariable(t *testing.T) {
	for _, tc := range []struct {
		path string
		set  func(cb *v1alpha1.CacheBackend, v string)
	}{
		{"spec.lmCache.localDisk.path", func(cb *v1alpha1.CacheBackend, v string) {
			cb.Spec.LMCache = &v1alpha1.LMCacheConfig{LocalDisk: &v1alpha1.LocalDiskTier{Path: "/cache/" + v, MaxSize: resource.MustParse("1Gi")}}
		}},
		{"spec.observation.modelID", func(cb *v1alpha1.CacheBackend, v string) {
			cb.Spec.Observation = &v1alpha1.Observation{ModelID: "org/" + v}
		}},
		{"spec.multiprocess.l2.disk.path", func(cb *v1alpha1.CacheBackend, v string) {
			cb.Spec.Multiprocess = &v1alpha1.Multiprocess{L1: v1alpha1.MultiprocessL1{Size: resource.MustParse("1Gi")},
				L2: &v1alpha1.MultiprocessL2{Disk: &v1alpha1.MultiprocessDisk{Path: "/var/" + v, Capacity: resource.MustParse("1Gi")}}}
		}},
	} {
		t.Run(tc.path, func(t *testing.T) {
			for _, v := range []string{"$(HF_TOKEN)", "a$$$(LMCACHE_RESP_PASSWORD)", "$(unclosed"} {
				cb := overrides(v1alpha1.BackendTypeLMCache, nil)
				tc.set(cb, v)
				errs := Validate(cb)
				require.Len(t, errs, 1, "%s: %v", v, errs)
				assert.Equal(t, tc.path, errs[0].Field)
			}
			for _, v := range []string{"$$(HF_TOKEN)", "a$b", "$$$$(x)", "$)", "plain"} {
				cb := overrides(v1alpha1.BackendTypeLMCache, nil)
				tc.set(cb, v)
				assert.Empty(t, Validate(cb), v)
				assert.True(t, expandsNothing(v), v)
			}
		})
	}
}
