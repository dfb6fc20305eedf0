package inject

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
)

// minimalPatch is the JSON patch from pod (decoded from the request) to
// the decided pod: only the paths Decide changes, never a round trip of the
// whole pod through the compiled Pod type, which would drop fields this
// build does not know and rewrite ones it does. Decide changes annotations,
// appends to the args, env and volume mounts of the engine container, and
// appends containers, init containers (the native sidecar) and volumes;
// anything else is a bug the patch refuses to hide.
func minimalPatch(pod, out *corev1.Pod, hasMetadata bool) ([]jsonpatch.Operation, error) {
	var ops []jsonpatch.Operation
	add := func(path string, v any) { push(&ops, jsonpatch.NewOperation("add", path, v)) }

	switch {
	case maps.Equal(pod.Annotations, out.Annotations):
	case !hasMetadata:
		add("/metadata", map[string]any{"annotations": out.Annotations})
	case len(pod.Annotations) == 0:
		add("/metadata/annotations", out.Annotations)
	default:
		for _, k := range sortedKeys(pod.Annotations) {
			if _, ok := out.Annotations[k]; !ok {
				push(&ops, jsonpatch.NewOperation("remove", "/metadata/annotations/"+escape(k), nil))
			}
		}
		for _, k := range sortedKeys(out.Annotations) {
			if v, ok := pod.Annotations[k]; !ok || v != out.Annotations[k] {
				add("/metadata/annotations/"+escape(k), out.Annotations[k])
			}
		}
	}

	if len(out.Spec.Containers) < len(pod.Spec.Containers) {
		return nil, fmt.Errorf("the decision removed containers")
	}
	for i := range pod.Spec.Containers {
		was, now := &pod.Spec.Containers[i], &out.Spec.Containers[i]
		base := fmt.Sprintf("/spec/containers/%d/", i)
		if err := appendOps(&ops, base+"args", was.Args, now.Args); err != nil {
			return nil, err
		}
		if err := appendOps(&ops, base+"env", was.Env, now.Env); err != nil {
			return nil, err
		}
		if err := appendOps(&ops, base+"volumeMounts", was.VolumeMounts, now.VolumeMounts); err != nil {
			return nil, err
		}
	}
	for _, c := range out.Spec.Containers[len(pod.Spec.Containers):] {
		add("/spec/containers/-", c)
	}
	if err := appendOps(&ops, "/spec/initContainers", pod.Spec.InitContainers, out.Spec.InitContainers); err != nil {
		return nil, err
	}
	if err := appendOps(&ops, "/spec/volumes", pod.Spec.Volumes, out.Spec.Volumes); err != nil {
		return nil, err
	}
	return ops, nil
}

// appendOps adds the items of now beyond was (of which now must be an
// extension) to the list at path.
func appendOps[T any](ops *[]jsonpatch.Operation, path string, was, now []T) error {
	if len(now) == len(was) {
		return nil
	}
	if len(now) < len(was) {
		return fmt.Errorf("the decision shortened %s", path)
	}
	if len(was) == 0 {
		// Absent, null or empty in the request: set the whole list.
		push(ops, jsonpatch.NewOperation("add", path, now))
		return nil
	}
	// One path for every item, and each value by pointer into now (a
	// pointer in an interface is not a copy on the heap; it marshals as
	// the value): two allocations fewer per appended item.
	end := path + "/-"
	for i := len(was); i < len(now); i++ {
		push(ops, jsonpatch.NewOperation("add", end, &now[i]))
	}
	return nil
}

// push appends op to ops, making room for a wired pod's dozen or so
// operations at the first: one allocation instead of the slice's
// doublings, and none for a pod the decision left as it was.
func push(ops *[]jsonpatch.Operation, op jsonpatch.Operation) {
	if cap(*ops) == 0 {
		*ops = make([]jsonpatch.Operation, 0, 16)
	}
	*ops = append(*ops, op)
}

// sortedKeys is slices.Sorted(maps.Keys(m)) in one allocation (the
// iterator's collect grows its slice by doubling: a pod's dozen
// annotations cost four or five).
func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// escape encodes a map key as a JSON pointer token (RFC 6901).
func escape(k string) string {
	return strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
}

// StripPatch is the patch that removes, from the pod o, the annotations
// the webhook strips from every pod it admits (a receipt or a stamp a user
// pre-set), and nothing else: what a fail-open answer applies when the
// pod's metadata was read, so that failing open never lets a forged
// receipt through. Empty when o carries none.
func StripPatch(o Object) []jsonpatch.Operation {
	if o.Metadata == nil {
		return nil
	}
	var ops []jsonpatch.Operation
	for _, k := range slices.Sorted(maps.Keys(o.Metadata.Annotations)) {
		if Stripped(k) {
			ops = append(ops, jsonpatch.NewOperation("remove", "/metadata/annotations/"+escape(k), nil))
		}
	}
	return ops
}
