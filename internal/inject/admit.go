package inject

import (
	"fmt"

	"gomodules.xyz/jsonpatch/v2"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// Admit reads a pod from its admission JSON and admits it (AdmitObject).
func Admit(raw []byte, backends []v1alpha1.CacheBackend, opts Options) (Decision, []jsonpatch.Operation, error) {
	o, err := ReadObject(raw)
	if err != nil {
		return Decision{}, nil, err
	}
	return AdmitObject(o, backends, opts)
}

// AdmitObject decides on a pod read from an admission request and returns
// the JSON patch that turns the request's pod into the decided one. It is
// the webhook without the API: pure, so that it can be fuzzed and
// benchmarked. The patch names only the paths the decision changes (see
// minimalPatch), so it applies to exactly what the API server sent and
// leaves every other field, including fields this build does not know, as
// sent.
func AdmitObject(o Object, backends []v1alpha1.CacheBackend, opts Options) (Decision, []jsonpatch.Operation, error) {
	pod, err := o.Pod()
	if err != nil {
		return Decision{}, nil, err
	}
	d := Decide(pod, backends, opts)
	patch, err := minimalPatch(pod, d.Pod, o.Metadata != nil)
	if err != nil {
		return d, nil, fmt.Errorf("computing patch: %w", err)
	}
	return d, patch, nil
}
