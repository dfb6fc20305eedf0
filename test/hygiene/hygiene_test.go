// Package hygiene checks the project files that no build reads: the
// licence, and that the Renovate configuration really finds every pinned
// version it is meant to update.
package hygiene

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type renovateConfig struct {
	EnabledManagers []string `json:"enabledManagers"`
	CustomManagers  []struct {
		CustomType          string   `json:"customType"`
		ManagerFilePatterns []string `json:"managerFilePatterns"`
		MatchStrings        []string `json:"matchStrings"`
		DatasourceTemplate  string   `json:"datasourceTemplate"`
	} `json:"customManagers"`
}

// TestRenovateFindsThePinnedControlPlane runs the regex manager's patterns
// (ECMAScript named groups are valid Go syntax) over test/tools/install.sh:
// each *_VERSION the script builds from must be found, with its datasource,
// module and current value.
func TestRenovateFindsThePinnedControlPlane(t *testing.T) {
	raw, err := os.ReadFile("../../renovate.json")
	require.NoError(t, err)
	var cfg renovateConfig
	require.NoError(t, json.Unmarshal(raw, &cfg))
	assert.Contains(t, cfg.EnabledManagers, "gomod", "every go.mod is updated by the gomod manager")
	assert.Contains(t, cfg.EnabledManagers, "custom.regex")

	script, err := os.ReadFile("../tools/install.sh")
	require.NoError(t, err)
	pinned := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^([A-Z]+)_VERSION=(\S+)$`).FindAllStringSubmatch(string(script), -1) {
		pinned[m[1]] = m[2]
	}
	require.Len(t, pinned, 3, "KUBE, ETCD and KWOK versions in install.sh")

	found := map[string]string{} // depName -> currentValue
	groups, _ := renovateFinds(t, cfg, "test/tools/install.sh", script)
	for _, g := range groups {
		assert.Equal(t, "go", g["datasource"], "%s is looked up on the Go module proxy", g["depName"])
		found[g["depName"]] = g["currentValue"]
	}
	assert.Equal(t, map[string]string{
		"k8s.io/kubernetes":         pinned["KUBE"],
		"go.etcd.io/etcd/server/v3": pinned["ETCD"],
		"sigs.k8s.io/kwok":          pinned["KWOK"],
	}, found)

	// The real node's parts (test/tools/install-node.sh); its kubelet is
	// the control plane's release.
	script, err = os.ReadFile("../tools/install-node.sh")
	require.NoError(t, err)
	node := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^([A-Z]+)_VERSION=(\S+)$`).FindAllStringSubmatch(string(script), -1) {
		node[m[1]] = m[2]
	}
	require.Len(t, node, 3, "KUBE, CONTAINERD and COREDNS versions in install-node.sh")
	assert.Equal(t, pinned["KUBE"], node["KUBE"], "the kubelet is the control plane's release")
	found = map[string]string{}
	groups, _ = renovateFinds(t, cfg, "test/tools/install-node.sh", script)
	for _, g := range groups {
		assert.Equal(t, "go", g["datasource"], "%s is looked up on the Go module proxy", g["depName"])
		found[g["depName"]] = g["currentValue"]
	}
	assert.Equal(t, map[string]string{
		"k8s.io/kubernetes":                   node["KUBE"],
		"github.com/containerd/containerd/v2": node["CONTAINERD"],
		"github.com/coredns/coredns":          node["COREDNS"],
	}, found)
}

// TestEveryGoModIsAModuleRenovateSees: the gomod manager's default pattern
// matches every go.mod of the repository (so a new test module is covered
// without a config change).
func TestEveryGoModIsAModuleRenovateSees(t *testing.T) {
	gomod := regexp.MustCompile(`(^|/)go\.mod$`)
	var n int
	require.NoError(t, filepath.WalkDir("../..", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "dist" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if d.Name() == "go.mod" {
			rel, _ := filepath.Rel("../..", p)
			assert.Regexp(t, gomod, filepath.ToSlash(rel))
			n++
		}
		return nil
	}))
	assert.GreaterOrEqual(t, n, 3)
}

func TestLicenseIsApache2(t *testing.T) {
	raw, err := os.ReadFile("../../LICENSE")
	require.NoError(t, err)
	s := string(raw)
	assert.Contains(t, s, "Apache License")
	assert.Contains(t, s, "Version 2.0, January 2004")
	assert.Contains(t, s, "END OF TERMS AND CONDITIONS")
}

// TestRenovateFindsTheEngineReleases (issue 36): the regex manager for
// test/tools/python/tested-versions.txt finds every release the
// conformance cells pin (each NAME==VERSION line), looked up on PyPI, so
// that a new vLLM, LMCache or SGLang release opens a pull request.
func TestRenovateFindsTheEngineReleases(t *testing.T) {
	raw, err := os.ReadFile("../../renovate.json")
	require.NoError(t, err)
	var cfg renovateConfig
	require.NoError(t, json.Unmarshal(raw, &cfg))
	const path = "test/tools/python/tested-versions.txt"
	text, err := os.ReadFile("../../" + path)
	require.NoError(t, err)
	var want []string // NAME==VERSION, in file order (vllm twice: one per cell)
	for _, line := range strings.Split(string(text), "\n") {
		if _, _, ok := strings.Cut(line, "=="); ok && !strings.HasPrefix(line, "#") {
			want = append(want, strings.TrimSpace(line))
		}
	}
	require.Contains(t, want, "vllm==0.34.0")
	require.Contains(t, want, "lmcache==0.5.7rc2")
	require.Contains(t, want, "sglang==0.5.23")
	var found []string
	groups, datasources := renovateFinds(t, cfg, path, text)
	for _, g := range groups {
		found = append(found, g["depName"]+"=="+g["currentValue"])
	}
	for _, d := range datasources {
		assert.Equal(t, "pypi", d)
	}
	assert.Equal(t, want, found)
}

// renovateFinds runs cfg's regex managers whose file patterns match path
// over text (ECMAScript named groups are valid Go syntax): the named
// groups of every match, in order, and each such manager's
// datasourceTemplate.
func renovateFinds(t *testing.T, cfg renovateConfig, path string, text []byte) (groups []map[string]string, datasources []string) {
	t.Helper()
	for _, m := range cfg.CustomManagers {
		require.Equal(t, "regex", m.CustomType)
		if !slices.ContainsFunc(m.ManagerFilePatterns, func(p string) bool { return regexp.MustCompile(strings.Trim(p, "/")).MatchString(path) }) {
			continue
		}
		datasources = append(datasources, m.DatasourceTemplate)
		for _, s := range m.MatchStrings {
			re := regexp.MustCompile(s)
			for _, sub := range re.FindAllStringSubmatch(string(text), -1) {
				g := map[string]string{}
				for i, name := range re.SubexpNames() {
					g[name] = sub[i]
				}
				groups = append(groups, g)
			}
		}
	}
	return groups, datasources
}
