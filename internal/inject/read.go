package inject

import (
	"bytes"
	"fmt"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	corev1 "k8s.io/api/core/v1"
)

// Object is a pod as the webhook reads it from an admission request, with
// github.com/go-json-experiment/json (the candidate for Go's
// encoding/json/v2) in the API server's way: field names case-sensitive,
// no duplicate names, valid UTF-8. What selecting a CacheBackend needs
// (the metadata) is decoded; of the spec only its place in the bytes read
// is noted, and it is decoded only for a pod a decision reads further
// (Pod), so that a pod no CacheBackend claims costs one pass over its bytes
// and no copy of them. The webhook reads it once per admission, as a field
// of the AdmissionReview or with ReadObject, and hands it to AdmitObject.
type Object struct {
	// Metadata is nil when the pod has no metadata object (absent or null).
	Metadata *ObjectMeta `json:"metadata"`
	// SpecAt is where the spec lies in the bytes the pod was read from.
	SpecAt Span `json:"spec"`
	// spec is the spec's bytes once Bind has found them (nil when absent).
	spec []byte
}

// Span is where a JSON value lies in the input being decoded: it passes
// over the value (checking its syntax) and notes its offsets, copying
// nothing.
type Span struct{ start, end int64 }

// UnmarshalJSONFrom notes the offsets around the next value.
func (s *Span) UnmarshalJSONFrom(dec *jsontext.Decoder) error {
	start := dec.InputOffset() // after the member's name, before its colon
	if err := dec.SkipValue(); err != nil {
		return err
	}
	s.start, s.end = start, dec.InputOffset()
	return nil
}

// Bind returns o with its spec's bytes taken from in, the input o was
// decoded from (the pod's JSON, or an AdmissionReview holding it). o
// refers to in from then on: in must not change while o is in use.
func (o Object) Bind(in []byte) (Object, error) {
	s := o.SpecAt
	if s.start < 0 || s.start > s.end || s.end > int64(len(in)) {
		return Object{}, fmt.Errorf("decoding pod: spec at %d..%d of %d bytes", s.start, s.end, len(in))
	}
	o.spec = bytes.TrimLeft(in[s.start:s.end], " \t\r\n:")
	if len(o.spec) == 0 {
		o.spec = nil
	}
	return o, nil
}

// ObjectMeta is the part of a pod's metadata a decision reads.
type ObjectMeta struct {
	Name         string            `json:"name"`
	GenerateName string            `json:"generateName"`
	Namespace    string            `json:"namespace"`
	Labels       map[string]string `json:"labels"`
	Annotations  map[string]string `json:"annotations"`
}

// ReadObject reads a pod's JSON as the webhook does.
func ReadObject(raw []byte) (Object, error) {
	var o Object
	if err := json.Unmarshal(raw, &o); err != nil {
		return Object{}, fmt.Errorf("decoding pod: %w", err)
	}
	return o.Bind(raw)
}

// Labels are the pod's labels, which select its CacheBackend.
func (o Object) Labels() map[string]string {
	if o.Metadata == nil {
		return nil
	}
	return o.Metadata.Labels
}

// Stripped reports whether the pod carries an annotation the webhook
// strips at admission (a receipt or an injection stamp), which a pod no
// CacheBackend claims must still lose.
func (o Object) Stripped() bool {
	return o.Metadata != nil && CarriesStripped(o.Metadata.Annotations)
}

// podSpec is the part of a pod's spec a decision reads: the init
// containers and the containers (the receipt's digest covers them; of the
// containers, all but their resources, which the digest leaves out), the
// volumes (the KV-event wiring appends its token volume after the pod's
// own, and the digest covers every volume's source), and the pod-level
// fields the digest covers (hostNetwork, serviceAccountName, hostAliases,
// dnsConfig). Nothing else is decoded: the rest of the pod, including
// fields this build does not know, stays as the API server sent it, since
// the patch (minimalPatch) names only the paths the decision changes.
type podSpec struct {
	InitContainers []corev1.Container `json:"initContainers"`
	Containers     []*podContainer    `json:"containers"`
	// Volumes are decoded whole: the receipt's digest covers every
	// volume's source (receipt.Digest).
	Volumes            []corev1.Volume `json:"volumes"`
	HostNetwork        bool            `json:"hostNetwork"`
	ServiceAccountName string          `json:"serviceAccountName"`
	// HostAliases and DNSConfig decide where the engine's names resolve;
	// the receipt's digest covers them (receipt.Digest).
	HostAliases []corev1.HostAlias   `json:"hostAliases"`
	DNSConfig   *corev1.PodDNSConfig `json:"dnsConfig"`
}

// podContainer is a container as Pod reads it: everything but its
// resources, which no decision reads and the receipt's digest leaves out
// (quantities are the dearest part of a container to decode).
type podContainer struct {
	corev1.Container
	Resources unread `json:"resources"`
}

// unread passes over a JSON value, which must be an object or null.
type unread struct{}

func (*unread) UnmarshalJSONFrom(dec *jsontext.Decoder) error {
	if k := dec.PeekKind(); k != '{' && k != 'n' {
		return fmt.Errorf("expected an object, got %v", k)
	}
	return dec.SkipValue()
}

// Pod decodes what a decision reads of the pod (its metadata and podSpec)
// into a Pod.
func (o Object) Pod() (*corev1.Pod, error) {
	pod := &corev1.Pod{}
	if m := o.Metadata; m != nil {
		pod.Name, pod.GenerateName, pod.Namespace, pod.Labels, pod.Annotations = m.Name, m.GenerateName, m.Namespace, m.Labels, m.Annotations
	}
	if o.spec == nil {
		return pod, nil
	}
	var spec podSpec
	if err := json.Unmarshal(o.spec, &spec); err != nil {
		return nil, fmt.Errorf("decoding pod: spec: %w", err)
	}
	pod.Spec.InitContainers, pod.Spec.HostNetwork = spec.InitContainers, spec.HostNetwork
	pod.Spec.HostAliases, pod.Spec.DNSConfig = spec.HostAliases, spec.DNSConfig
	pod.Spec.Volumes, pod.Spec.ServiceAccountName = spec.Volumes, spec.ServiceAccountName
	if spec.Containers != nil {
		pod.Spec.Containers = make([]corev1.Container, len(spec.Containers))
	}
	for i, c := range spec.Containers {
		if c == nil {
			return nil, fmt.Errorf("decoding pod: spec.containers[%d] is null", i)
		}
		pod.Spec.Containers[i] = c.Container
	}
	return pod, nil
}
