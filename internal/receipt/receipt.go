// Package receipt signs and verifies the webhook's injection receipts. A
// receipt (injected-by, injected-by-uid, injected-generation) is readable
// metadata that any pod creator could copy; the signature makes it
// unforgeable: an HMAC-SHA256, keyed by a secret only the operator reads,
// over the CacheBackend's identity and generation and a digest of the pod's
// containers as admitted. Containers' commands, arguments and environment are
// immutable once a pod exists, so the digest pins the configuration the
// webhook injected to the pod that carries the receipt.
package receipt

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// Annotations of a signed receipt. They are API.
const (
	// AnnotationDigest is sha256 of the pod's containers as admitted.
	AnnotationDigest = v1alpha1.AnnotationInjectedConfigDigest
	// AnnotationSignature is <key-id>:<hex HMAC-SHA256>.
	AnnotationSignature = v1alpha1.AnnotationReceiptSignature
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

func (c Claim) payload() []byte {
	return []byte(strings.Join([]string{"inferencecache.io/receipt/v1", c.Backend, c.UID, c.Generation, c.Digest}, "\n"))
}

// Sign returns the signature annotation value for c.
func Sign(k Key, c Claim) string {
	m := hmac.New(sha256.New, k.Secret)
	m.Write(c.payload())
	return k.ID + ":" + hex.EncodeToString(m.Sum(nil))
}

// Digest fingerprints a pod's containers: names, images, commands,
// arguments and environment, the fields the injection writes and that a
// pod cannot change after creation.
func Digest(pod *corev1.Pod) string {
	type fp struct {
		Name    string          `json:"n"`
		Image   string          `json:"i"`
		Command []string        `json:"c"`
		Args    []string        `json:"a"`
		Env     []corev1.EnvVar `json:"e"`
	}
	fps := make([]fp, 0, len(pod.Spec.Containers))
	for _, c := range pod.Spec.Containers {
		fps = append(fps, fp{c.Name, c.Image, c.Command, c.Args, c.Env})
	}
	raw, _ := json.Marshal(fps)
	sum := sha256.Sum256(raw)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Errors of Verify. Each says why a receipt is not trusted.
var (
	ErrUnsigned         = errors.New("the receipt is not signed")
	ErrUnknownKey       = errors.New("the receipt is signed with a key the operator does not hold (rotated out, or forged)")
	ErrBadSignature     = errors.New("the receipt's signature does not verify: it was not written by the webhook")
	ErrConfigMismatch   = errors.New("the pod's containers differ from the configuration the receipt was signed for")
	ErrIncompleteClaims = errors.New("the receipt is incomplete")
)

// ClaimOf reads the claim a pod's annotations make.
func ClaimOf(a map[string]string) Claim {
	return Claim{
		Backend:    a[v1alpha1.AnnotationInjectedBy],
		UID:        a[v1alpha1.AnnotationInjectedByUID],
		Generation: a[v1alpha1.AnnotationInjectedGeneration],
		Digest:     a[AnnotationDigest],
	}
}

// Verify checks that pod's receipt claim c was signed by one of keys and
// that the pod's containers are the ones it was signed for.
func Verify(keys []Key, pod *corev1.Pod, c Claim) error {
	if c.Backend == "" || c.UID == "" || c.Generation == "" || c.Digest == "" {
		return ErrIncompleteClaims
	}
	sig := pod.Annotations[AnnotationSignature]
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
		if Digest(pod) != c.Digest {
			return ErrConfigMismatch
		}
		return nil
	}
	return fmt.Errorf("%w: key %s", ErrUnknownKey, id)
}
