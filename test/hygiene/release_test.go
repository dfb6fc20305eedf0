package hygiene

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// TestReleaseWorkflowRunsWhatExists: every `make <target>` the release
// workflow runs is a target of the Makefile, and every `./hack/...`
// program it runs exists, so the tag-driven release calls the commands a
// maintainer runs locally (actionlint, in make verify, checks the
// workflow's syntax and its shell; it cannot see the Makefile).
func TestReleaseWorkflowRunsWhatExists(t *testing.T) {
	raw, err := os.ReadFile("../../.github/workflows/release.yml")
	require.NoError(t, err)
	var wf struct {
		Jobs map[string]struct {
			Steps []struct {
				Run string `json:"run"`
			} `json:"steps"`
		} `json:"jobs"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &wf))
	mk, err := os.ReadFile("../../Makefile")
	require.NoError(t, err)
	targets := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([a-z][a-z0-9-]*):`).FindAllStringSubmatch(string(mk), -1) {
		targets[m[1]] = true
	}
	makeRun := regexp.MustCompile(`\bmake ([a-z][a-z0-9-]*)`)
	hackRun := regexp.MustCompile(`go run (\./hack/[a-z0-9-]+)`)
	var made []string
	for name, job := range wf.Jobs {
		for _, st := range job.Steps {
			for _, m := range makeRun.FindAllStringSubmatch(st.Run, -1) {
				made = append(made, m[1])
				assert.True(t, targets[m[1]], "job %s runs make %s, which the Makefile does not define", name, m[1])
			}
			for _, m := range hackRun.FindAllStringSubmatch(st.Run, -1) {
				_, err := os.Stat("../../" + strings.TrimPrefix(m[1], "./") + "/main.go")
				assert.NoError(t, err, "job %s runs go run %s", name, m[1])
			}
		}
	}
	for _, want := range []string{"test", "push", "build-installer", "chart-package", "krew-manifest", "sbom", "release-notes"} {
		assert.Contains(t, made, want, "the release runs make %s", want)
	}
}
