package inject

import (
	"fmt"

	"gomodules.xyz/jsonpatch/v2"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// Admit decodes a pod from its admission JSON, decides, and returns the
// JSON patch that turns raw into the decided pod. It is the handler without
// the API: pure, so that it can be fuzzed and benchmarked. The patch names
// only the paths the decision changes (see minimalPatch), so it applies to
// exactly what the API server sent and leaves every other field, including
// fields this build does not know, as sent.
func Admit(raw []byte, backends []v1alpha1.CacheBackend, opts Options) (Decision, []jsonpatch.Operation, error) {
	pod, hasMetadata, err := decodePod(raw)
	if err != nil {
		return Decision{}, nil, err
	}
	d := Decide(pod, backends, opts)
	patch, err := minimalPatch(pod, d.Pod, hasMetadata)
	if err != nil {
		return d, nil, fmt.Errorf("computing patch: %w", err)
	}
	return d, patch, nil
}
