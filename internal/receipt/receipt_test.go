package receipt

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func signedPod(k Key) (*corev1.Pod, Claim) {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "sglang", Image: "lmsysorg/sglang", Args: []string{"--enable-hierarchical-cache"},
		}}},
	}
	c := Claim{Backend: "llm/hicache", UID: "uid-1", Generation: "2", Digest: Digest(p)}
	p.Annotations[AnnotationDigest] = c.Digest
	p.Annotations[AnnotationSignature] = Sign(k, c)
	return p, c
}

func TestVerify(t *testing.T) {
	key := NewKey([]byte("0123456789abcdef0123456789abcdef"))
	other := NewKey([]byte("fedcba9876543210fedcba9876543210"))

	p, c := signedPod(key)
	require.NoError(t, Verify([]Key{key}, p, c))
	require.NoError(t, Verify([]Key{other, key}, p, c), "the previous key still verifies during rotation")

	assert.ErrorIs(t, Verify([]Key{other}, p, c), ErrUnknownKey, "a key the operator does not hold")

	forged := c
	forged.Generation = "3"
	assert.ErrorIs(t, Verify([]Key{key}, p, forged), ErrBadSignature, "a changed generation breaks the signature")
	forged = c
	forged.UID = "uid-2"
	assert.ErrorIs(t, Verify([]Key{key}, p, forged), ErrBadSignature)

	tampered := p.DeepCopy()
	tampered.Spec.Containers[0].Args = nil
	assert.ErrorIs(t, Verify([]Key{key}, tampered, c), ErrConfigMismatch, "a receipt copied onto another configuration")

	unsigned := p.DeepCopy()
	delete(unsigned.Annotations, AnnotationSignature)
	assert.ErrorIs(t, Verify([]Key{key}, unsigned, c), ErrUnsigned)

	handWritten := p.DeepCopy()
	handWritten.Annotations[AnnotationSignature] = key.ID + ":00ff"
	assert.ErrorIs(t, Verify([]Key{key}, handWritten, c), ErrBadSignature, "the key id is public; the HMAC is not")

	assert.True(t, errors.Is(Verify([]Key{key}, p, Claim{}), ErrIncompleteClaims))
}

func TestKeyIDDoesNotRevealTheKey(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	k := NewKey(secret)
	assert.Len(t, k.ID, 16)
	assert.NotContains(t, k.ID, string(secret[:8]))
}
