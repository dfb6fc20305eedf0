package conformance_test

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/test/testutil/pyenv"
)

// TestAllowListIsTheEngines: every flag of the engineOverrides allow-list is
// an option of the engine's own parser, taking as many values as the
// allow-list says, and every env name is defined by the owner the
// allow-list names (vLLM's envs, SGLang's Envs, LMCache's config, the Hub
// client), read from their installed code.
//
// It runs against every supported vLLM and LMCache pair (pyenv.Cells).
func TestAllowListIsTheEngines(t *testing.T) {
	type engineEnv struct {
		engine, pyenv string
		rt            v1alpha1.Runtime
		t             v1alpha1.BackendType
	}
	var envs []engineEnv
	for _, cell := range pyenv.Cells(t, "vllm") {
		envs = append(envs, engineEnv{"vllm", cell.Env, v1alpha1.RuntimeVLLM, v1alpha1.BackendTypeLMCache})
	}
	envs = append(envs, engineEnv{"sglang", pyenv.SGLang, v1alpha1.RuntimeSGLang, v1alpha1.BackendTypeSGLangHiCache})
	for _, tc := range envs {
		t.Run(tc.pyenv, func(t *testing.T) {
			flags := inject.AllowedFlags(tc.rt)
			owners := inject.AllowedEnvNames(tc.rt, tc.t)
			req := struct {
				Engine string   `json:"engine"`
				Flags  []string `json:"flags"`
				Env    []string `json:"env"`
			}{Engine: tc.engine}
			for _, f := range flags {
				req.Flags = append(req.Flags, f.Name)
			}
			for _, names := range owners {
				req.Env = append(req.Env, names...)
			}
			slices.Sort(req.Env)
			var resp struct {
				Flags map[string]struct {
					Known bool `json:"known"`
					Nargs any  `json:"nargs"`
				} `json:"flags"`
				Env map[string]*string `json:"env"`
			}
			pyenv.RunJSON(t, tc.pyenv, filepath.Join(pyenv.Root(t), "test", "conformance", "py", "allowlist.py"), req, &resp)
			for _, f := range flags {
				got := resp.Flags[f.Name]
				if !assert.True(t, got.Known, "%s: the engine's parser has no %s", tc.engine, f.Name) {
					continue
				}
				want := map[inject.Arity]any{inject.NoValue: 0.0, inject.OneValue: nil, inject.OneOrMore: "+"}[f.Arity]
				assert.Equal(t, want, got.Nargs, "%s %s: nargs", tc.engine, f.Name)
			}
			for owner, names := range owners {
				for _, n := range names {
					got := resp.Env[n]
					if assert.NotNil(t, got, "%s: no code of the engine defines %s", tc.engine, n) {
						assert.Equal(t, owner, *got, n)
					}
				}
			}
			assert.NotEmpty(t, flags)
		})
	}
}
