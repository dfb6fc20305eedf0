package inject

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	sigsjson "sigs.k8s.io/json"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// decodePod reads the part of a pod the decision needs, the way the API
// server reads it (case-sensitive field names, so that every field the
// result holds is at the same JSON path in raw): metadata's names, labels
// and annotations, the init containers and the containers (the receipt's
// digest covers them; of the containers, all but their resources, which
// the digest leaves out), the volumes' names (the KV-event wiring
// appends its token volume after the pod's own) and the source of a volume
// named like the webhook's index-token volume (the digest covers it; other
// sources are not read), and
// hostNetwork. Nothing else is decoded: the rest of the pod,
// including fields this build does not know, stays as the API server sent
// it, since the patch (minimalPatch) names only the paths the decision
// changes. It reports whether raw has a metadata object.
func decodePod(raw []byte) (*corev1.Pod, bool, error) {
	var in struct {
		Metadata *struct {
			Name         string            `json:"name"`
			GenerateName string            `json:"generateName"`
			Namespace    string            `json:"namespace"`
			Labels       map[string]string `json:"labels"`
			Annotations  map[string]string `json:"annotations"`
		} `json:"metadata"`
		Spec struct {
			InitContainers []corev1.Container `json:"initContainers"`
			Containers     []*podContainer    `json:"containers"`
			Volumes        []struct {
				Name      string          `json:"name"`
				Projected json.RawMessage `json:"projected"`
			} `json:"volumes"`
			HostNetwork bool `json:"hostNetwork"`
		} `json:"spec"`
	}
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(raw, &in); err != nil {
		return nil, false, fmt.Errorf("decoding pod: %w", err)
	}
	pod := &corev1.Pod{Spec: corev1.PodSpec{InitContainers: in.Spec.InitContainers, HostNetwork: in.Spec.HostNetwork}}
	if in.Spec.Volumes != nil {
		pod.Spec.Volumes = make([]corev1.Volume, len(in.Spec.Volumes))
		for i, v := range in.Spec.Volumes {
			pod.Spec.Volumes[i].Name = v.Name
			if v.Name != v1alpha1.VolumeIndexToken || v.Projected == nil {
				continue
			}
			src := &corev1.ProjectedVolumeSource{}
			if err := sigsjson.UnmarshalCaseSensitivePreserveInts(v.Projected, src); err != nil {
				return nil, false, fmt.Errorf("decoding pod: spec.volumes[%d].projected: %w", i, err)
			}
			pod.Spec.Volumes[i].Projected = src
		}
	}
	if m := in.Metadata; m != nil {
		pod.Name, pod.GenerateName, pod.Namespace, pod.Labels, pod.Annotations = m.Name, m.GenerateName, m.Namespace, m.Labels, m.Annotations
	}
	if in.Spec.Containers != nil {
		pod.Spec.Containers = make([]corev1.Container, len(in.Spec.Containers))
	}
	for i, c := range in.Spec.Containers {
		if c == nil {
			return nil, false, fmt.Errorf("decoding pod: spec.containers[%d] is null", i)
		}
		pod.Spec.Containers[i] = c.Container
	}
	return pod, in.Metadata != nil, nil
}

// podContainer is a container as decodePod reads it: everything but its
// resources, which no decision reads and the receipt's digest leaves out
// (quantities are the dearest part of a container to decode).
type podContainer struct {
	corev1.Container
	Resources unread `json:"resources"`
}

// unread passes over a JSON value, which must be an object or null.
type unread struct{}

func (*unread) UnmarshalJSON(b []byte) error {
	if len(b) == 0 || b[0] != '{' && string(b) != "null" {
		return fmt.Errorf("expected an object, got %.20s", b)
	}
	return nil
}

// PodMeta reads only what selecting a CacheBackend and the no-match
// verdict need: the pod's labels, and whether it carries annotations the
// webhook strips at admission.
func PodMeta(raw []byte) (labels map[string]string, receipts bool, err error) {
	var in struct {
		Metadata struct {
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
	}
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(raw, &in); err != nil {
		return nil, false, fmt.Errorf("decoding pod metadata: %w", err)
	}
	return in.Metadata.Labels, CarriesStripped(in.Metadata.Annotations), nil
}

// minimalPatch is the JSON patch from pod (decoded from the request) to
// the decided pod: only the paths Decide changes, never a round trip of the
// whole pod through the compiled Pod type, which would drop fields this
// build does not know and rewrite ones it does. Decide changes annotations,
// appends to the args and env of the engine container, and appends
// containers, init containers (the native sidecar) and volumes; anything
// else is a bug the patch refuses to hide.
func minimalPatch(pod, out *corev1.Pod, hasMetadata bool) ([]jsonpatch.Operation, error) {
	var ops []jsonpatch.Operation
	add := func(path string, v any) { ops = append(ops, jsonpatch.NewOperation("add", path, v)) }

	switch {
	case maps.Equal(pod.Annotations, out.Annotations):
	case !hasMetadata:
		add("/metadata", map[string]any{"annotations": out.Annotations})
	case len(pod.Annotations) == 0:
		add("/metadata/annotations", out.Annotations)
	default:
		for _, k := range slices.Sorted(maps.Keys(pod.Annotations)) {
			if _, ok := out.Annotations[k]; !ok {
				ops = append(ops, jsonpatch.NewOperation("remove", "/metadata/annotations/"+escape(k), nil))
			}
		}
		for _, k := range slices.Sorted(maps.Keys(out.Annotations)) {
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
		*ops = append(*ops, jsonpatch.NewOperation("add", path, now))
		return nil
	}
	for _, v := range now[len(was):] {
		*ops = append(*ops, jsonpatch.NewOperation("add", path+"/-", v))
	}
	return nil
}

// escape encodes a map key as a JSON pointer token (RFC 6901).
func escape(k string) string {
	return strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
}
