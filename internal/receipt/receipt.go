// Package receipt signs and verifies the webhook's injection receipts. A
// receipt (injected-by, injected-by-uid, injected-generation) is readable
// metadata that any pod creator could copy; the signature makes it
// unforgeable: an HMAC-SHA256, keyed by a secret only the operator reads,
// over the CacheBackend's identity and generation and a digest of the pod's
// containers and init containers as admitted. A container's command,
// arguments, environment and mounts are immutable once a pod exists, so the
// digest pins the configuration the webhook injected to the pod that carries
// the receipt.
package receipt

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// Key is one HMAC key with its public identifier.
type Key struct {
	ID     string
	Secret []byte
}

// NewKey derives a key's identifier from its secret: the first 8 bytes of
// its SHA-256, in hex. The identifier says which key signed a receipt
// without revealing it.
func NewKey(secret []byte) Key {
	sum := sha256.Sum256(secret)
	return Key{ID: hex.EncodeToString(sum[:8]), Secret: secret}
}

// Claim is what a receipt asserts.
type Claim struct {
	// Backend is <namespace>/<name> of the CacheBackend.
	Backend    string
	UID        string
	Generation string
	Digest     string
}

// payloadVersion names the signed payload's layout. v1 joined the fields
// with newlines, which is not injective (a newline moved from one field to
// the next signed the same bytes); v2 prefixes each field with its length.
const payloadVersion = "inferencecache.io/receipt/v2"

// payload is the signed byte string: every field, the version first,
// preceded by its length as a 4-byte big-endian integer, so that two
// different claims never produce the same payload.
func (c Claim) payload() []byte {
	fields := []string{payloadVersion, c.Backend, c.UID, c.Generation, c.Digest}
	n := 0
	for _, f := range fields {
		n += 4 + len(f)
	}
	b := make([]byte, 0, n)
	for _, f := range fields {
		b = binary.BigEndian.AppendUint32(b, uint32(len(f)))
		b = append(b, f...)
	}
	return b
}

// Sign returns the signature annotation value for c.
func Sign(k Key, c Claim) string {
	m := hmac.New(sha256.New, k.Secret)
	m.Write(c.payload())
	return k.ID + ":" + hex.EncodeToString(m.Sum(nil))
}

// Digest fingerprints what a pod runs, for a receipt the webhook writes
// now: its init containers and containers (every field of each: command,
// arguments, env, envFrom, mounts, security context, image, ... except
// resources, which an in-place resize (pods/resize) may change on a
// running pod), all its volumes with their sources, and the pod-level
// fields that decide where the engine's names resolve and as whom it runs
// (hostAliases, dnsConfig, hostNetwork, serviceAccountName). A container
// the webhook never touched counts too: an init container can rewrite
// what the engine reads (a shared volume, a wrapper script). So a receipt
// copied onto a pod that differs in any of these does not verify. All of
// them are immutable once the pod exists, so the stored pod digests as
// the webhook's view of it did. The value is "sha256v2:<hex>" (issue 35).
func Digest(pod *corev1.Pod) string {
	return hashed(digestV2, struct {
		digestedSpec
		HostNetwork        bool   `json:"n,omitempty"`
		ServiceAccountName string `json:"s,omitempty"`
	}{specOf(pod, pod.Spec.Volumes), pod.Spec.HostNetwork, pod.Spec.ServiceAccountName})
}

// digestedSpec is what both digest schemes cover, in this order; the
// current one adds hostNetwork and serviceAccountName after it, and all
// volumes where the earlier one took the webhook's own.
type digestedSpec struct {
	Init        []corev1.Container   `json:"i"`
	Containers  []corev1.Container   `json:"c"`
	Volumes     []corev1.Volume      `json:"v,omitempty"`
	HostAliases []corev1.HostAlias   `json:"h,omitempty"`
	DNSConfig   *corev1.PodDNSConfig `json:"d,omitempty"`
}

func specOf(pod *corev1.Pod, volumes []corev1.Volume) digestedSpec {
	return digestedSpec{stripResources(pod.Spec.InitContainers), stripResources(pod.Spec.Containers), volumes, pod.Spec.HostAliases, pod.Spec.DNSConfig}
}

// hashed is prefix and the hex SHA-256 of v's JSON.
func hashed(prefix string, v any) string {
	raw, _ := json.Marshal(v)
	sum := sha256.Sum256(raw)
	return prefix + hex.EncodeToString(sum[:])
}

// The prefixes of the two digest schemes.
const (
	digestV1 = "sha256:"
	digestV2 = "sha256v2:"
)

// DigestLike is the digest of pod in the scheme of claimed, a receipt's
// digest: Digest for receipts written now, digestV1Of for those an
// earlier operator wrote ("sha256:"), so that their pods keep verifying
// until the receipt key is rotated (docs/security.md).
func DigestLike(pod *corev1.Pod, claimed string) string {
	if strings.HasPrefix(claimed, digestV1) {
		return digestV1Of(pod)
	}
	return Digest(pod)
}

// digestV1Of is the digest of the receipts written before issue 35: the
// containers and init containers (resources left out), of the volumes
// only those the webhook adds (v1alpha1.VolumeIndexToken,
// v1alpha1.VolumeEngineSharedMemory), hostAliases and dnsConfig.
func digestV1Of(pod *corev1.Pod) string {
	var volumes []corev1.Volume
	for _, v := range pod.Spec.Volumes {
		if v.Name == v1alpha1.VolumeIndexToken || v.Name == v1alpha1.VolumeEngineSharedMemory {
			volumes = append(volumes, v)
		}
	}
	return hashed(digestV1, specOf(pod, volumes))
}

func stripResources(cs []corev1.Container) []corev1.Container {
	out := make([]corev1.Container, len(cs))
	for i := range cs {
		out[i] = cs[i]
		out[i].Resources = corev1.ResourceRequirements{}
	}
	return out
}

// Errors of Verify. Each says why a receipt is not trusted.
var (
	ErrUnsigned         = errors.New("the receipt is not signed")
	ErrUnknownKey       = errors.New("the receipt is signed with a key the operator does not hold (rotated out, or forged)")
	ErrBadSignature     = errors.New("the receipt's signature does not verify: it was not written by the webhook")
	ErrConfigMismatch   = errors.New("the pod's containers, volumes or identity differ from the configuration the receipt was signed for")
	ErrIncompleteClaims = errors.New("the receipt is incomplete")
)

// ClaimOf reads the claim a pod's annotations make.
func ClaimOf(a map[string]string) Claim {
	return Claim{
		Backend:    a[v1alpha1.AnnotationInjectedBy],
		UID:        a[v1alpha1.AnnotationInjectedByUID],
		Generation: a[v1alpha1.AnnotationInjectedGeneration],
		Digest:     a[v1alpha1.AnnotationInjectedConfigDigest],
	}
}

// Verify checks that pod's receipt claim c was signed by one of keys and
// that the pod's containers are the ones it was signed for.
func Verify(keys []Key, pod *corev1.Pod, c Claim) error {
	if err := VerifySignature(keys, pod.Annotations, c); err != nil {
		return err
	}
	if DigestLike(pod, c.Digest) != c.Digest {
		return ErrConfigMismatch
	}
	return nil
}

// VerifySignature checks that claim c, read from a pod's annotations, was
// signed by one of keys. It does not compare the pod's containers with the
// signed digest (Verify does).
func VerifySignature(keys []Key, annotations map[string]string, c Claim) error {
	if c.Backend == "" || c.UID == "" || c.Generation == "" || c.Digest == "" {
		return ErrIncompleteClaims
	}
	sig := annotations[v1alpha1.AnnotationReceiptSignature]
	if sig == "" {
		return ErrUnsigned
	}
	id, _, ok := strings.Cut(sig, ":")
	if !ok {
		return ErrBadSignature
	}
	for _, k := range keys {
		if k.ID != id {
			continue
		}
		if !hmac.Equal([]byte(Sign(k, c)), []byte(sig)) {
			return ErrBadSignature
		}
		return nil
	}
	return fmt.Errorf("%w: key %s", ErrUnknownKey, id)
}

// EventName is the name of the one receipt event the operator records for
// the pod with this name and UID: <pod name>.<20 hex digits of an
// HMAC-SHA256, keyed by k, over the pod's UID>. The name is the same for
// every manager (and after a restart), so creating the event a second time
// fails with AlreadyExists instead of reporting twice. The UID is assigned
// by the API server when the pod is created and the key is the operator's
// secret, so a pod creator, who may create Events in the namespace, cannot
// take the name in advance to suppress the report.
func EventName(k Key, podName string, uid string) string {
	m := hmac.New(sha256.New, k.Secret)
	m.Write([]byte("inferencecache.io/receipt-event/v1\x00"))
	m.Write([]byte(uid))
	suffix := hex.EncodeToString(m.Sum(nil))[:20]
	// An event name is a DNS subdomain (at most 253 characters).
	const maxPrefix = 253 - 1 - 20
	if len(podName) > maxPrefix {
		podName = strings.TrimRight(podName[:maxPrefix], ".-")
	}
	return podName + "." + suffix
}
