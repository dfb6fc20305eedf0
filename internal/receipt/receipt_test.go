package receipt

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/inferencecache/operator/api/v1alpha1"
)

func signedPod(k Key) (*corev1.Pod, Claim) {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "sglang", Image: "lmsysorg/sglang", Args: []string{"--enable-hierarchical-cache"},
		}}},
	}
	c := Claim{Backend: "llm/hicache", UID: "uid-1", Generation: "2", Digest: Digest(p)}
	p.Annotations[v1alpha1.AnnotationInjectedConfigDigest] = c.Digest
	p.Annotations[v1alpha1.AnnotationReceiptSignature] = Sign(k, c)
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
	delete(unsigned.Annotations, v1alpha1.AnnotationReceiptSignature)
	assert.ErrorIs(t, Verify([]Key{key}, unsigned, c), ErrUnsigned)

	handWritten := p.DeepCopy()
	handWritten.Annotations[v1alpha1.AnnotationReceiptSignature] = key.ID + ":00ff"
	assert.ErrorIs(t, Verify([]Key{key}, handWritten, c), ErrBadSignature, "the key id is public; the HMAC is not")

	assert.True(t, errors.Is(Verify([]Key{key}, p, Claim{}), ErrIncompleteClaims))
}

func TestKeyIDDoesNotRevealTheKey(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	k := NewKey(secret)
	assert.Len(t, k.ID, 16)
	assert.NotContains(t, k.ID, string(secret[:8]))
}

// TestPayloadIsInjective: a newline (or any byte) moved from one field to
// the next makes another payload, so a signature never carries over to a
// claim that differs only in where its fields split.
func TestPayloadIsInjective(t *testing.T) {
	key := NewKey([]byte("0123456789abcdef0123456789abcdef"))
	pairs := [][2]Claim{
		{{Backend: "ns/a", UID: "u\n1", Generation: "2", Digest: "d"}, {Backend: "ns/a\nu", UID: "1", Generation: "2", Digest: "d"}},
		{{Backend: "ns/a", UID: "u", Generation: "12", Digest: "d"}, {Backend: "ns/a", UID: "u1", Generation: "2", Digest: "d"}},
		{{Backend: "", UID: "u", Generation: "1", Digest: "d"}, {Backend: "u", UID: "", Generation: "1", Digest: "d"}},
	}
	for _, p := range pairs {
		assert.NotEqual(t, p[0].payload(), p[1].payload(), "%q and %q", p[0], p[1])
		assert.NotEqual(t, Sign(key, p[0]), Sign(key, p[1]))
	}
}

// TestDigestCoversTheWholeSpec: every container field the kubelet uses
// (except resources, which an in-place resize may change) and every init
// container are part of the digest.
func TestDigestCoversTheWholeSpec(t *testing.T) {
	base := &corev1.Pod{Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{{Name: "init", Image: "busybox"}},
		Containers:     []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai", Args: []string{"--model", "m"}}},
	}}
	d := Digest(base)
	changes := map[string]func(p *corev1.Pod){
		"init container command": func(p *corev1.Pod) { p.Spec.InitContainers[0].Command = []string{"sh", "-c", "cp evil /shared"} },
		"init container added": func(p *corev1.Pod) {
			p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: "x"})
		},
		"envFrom": func(p *corev1.Pod) {
			p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "env"}}}}
		},
		"volume mount": func(p *corev1.Pod) {
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "v", MountPath: "/etc/ld.so.preload"}}
		},
		"working dir":      func(p *corev1.Pod) { p.Spec.Containers[0].WorkingDir = "/tmp" },
		"security context": func(p *corev1.Pod) { p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{} },
		"image":            func(p *corev1.Pod) { p.Spec.Containers[0].Image = "other" },
		// issue 25: hostAliases could point the cache's host name elsewhere.
		"host aliases": func(p *corev1.Pod) {
			p.Spec.HostAliases = []corev1.HostAlias{{IP: "10.0.0.66", Hostnames: []string{"cache.llm.svc.cluster.local"}}}
		},
		"dns config": func(p *corev1.Pod) {
			p.Spec.DNSConfig = &corev1.PodDNSConfig{Nameservers: []string{"10.0.0.53"}}
		},
	}
	for name, change := range changes {
		p := base.DeepCopy()
		change(p)
		assert.NotEqual(t, d, Digest(p), name)
	}
	resized := base.DeepCopy()
	resized.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}
	assert.Equal(t, d, Digest(resized), "an in-place resize keeps the receipt valid")
	noAliases := base.DeepCopy()
	noAliases.Spec.HostAliases = []corev1.HostAlias{}
	assert.Equal(t, d, Digest(noAliases), "a pod without host aliases digests as before they counted")
	// The digest of base under the scheme before issue 35 (before
	// hostAliases and dnsConfig counted, too): a pod wired by an older
	// operator keeps its receipt, which names that scheme.
	assert.Equal(t, "sha256:f6fc58a530666d47f7db07875f7fbd46003cee7025741bb28de2f88382ab0cbe", digestV1Of(base))
	assert.Equal(t, digestV1Of(base), DigestLike(base, "sha256:anything"))
	assert.Equal(t, d, DigestLike(base, d))
	assert.True(t, strings.HasPrefix(d, "sha256v2:"), d)
}

// TestDigestCoversWhatThePodRunsAs (issue 35, from round two): a receipt
// copied onto a pod that differs from the wired one in a volume's source
// (its own volumes too: a model cache swapped for a hostPath), a volume
// added, hostNetwork or serviceAccountName does not verify. A receipt
// written before, in the earlier scheme ("sha256:"), still verifies on
// its own pod until the receipt key is rotated, and not on a pod with
// other containers.
func TestDigestCoversWhatThePodRunsAs(t *testing.T) {
	key := NewKey([]byte("0123456789abcdef0123456789abcdef"))
	base := &corev1.Pod{Spec: corev1.PodSpec{
		Containers:         []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai", VolumeMounts: []corev1.VolumeMount{{Name: "models", MountPath: "/models"}}}},
		Volumes:            []corev1.Volume{{Name: "models", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "models"}}}},
		ServiceAccountName: "default",
	}}
	signed := func(p *corev1.Pod, digest string) (*corev1.Pod, Claim) {
		c := Claim{Backend: "llm/cache", UID: "uid-cb", Generation: "1", Digest: digest}
		p = p.DeepCopy()
		p.Annotations = map[string]string{v1alpha1.AnnotationReceiptSignature: Sign(key, c)}
		return p, c
	}
	wired, claim := signed(base, Digest(base))
	require.NoError(t, Verify([]Key{key}, wired, claim))
	for name, change := range map[string]func(p *corev1.Pod){
		"a volume's source": func(p *corev1.Pod) {
			p.Spec.Volumes[0].VolumeSource = corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/other"}}
		},
		"a volume added":         func(p *corev1.Pod) { p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "extra"}) },
		"hostNetwork":            func(p *corev1.Pod) { p.Spec.HostNetwork = true },
		"another ServiceAccount": func(p *corev1.Pod) { p.Spec.ServiceAccountName = "model-puller" },
	} {
		copied := wired.DeepCopy()
		change(copied)
		assert.ErrorIs(t, Verify([]Key{key}, copied, claim), ErrConfigMismatch, name)
	}
	old, oldClaim := signed(base, digestV1Of(base))
	require.NoError(t, Verify([]Key{key}, old, oldClaim), "a receipt of the earlier scheme verifies on its pod")
	other := old.DeepCopy()
	other.Spec.Containers[0].Image = "other"
	assert.ErrorIs(t, Verify([]Key{key}, other, oldClaim), ErrConfigMismatch)
}

// TestDigestCoversTheWebhooksVolumes: in the scheme of receipts written
// before issue 35 (which still verify), the index-token volume the
// webhook adds is part of the digest (another audience or source breaks
// the receipt); volumes the webhook never adds are not, so receipts of
// pods admitted before the KV-event wiring keep verifying. In the current
// scheme every volume counts.
func TestDigestCoversTheWebhooksVolumes(t *testing.T) {
	token := func(audience string) corev1.Volume {
		return corev1.Volume{Name: v1alpha1.VolumeIndexToken, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: audience, Path: "token"}}}}}}
	}
	base := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}}}
	plain := digestV1Of(base)
	withUserVolume := base.DeepCopy()
	withUserVolume.Spec.Volumes = []corev1.Volume{{Name: "models"}}
	assert.Equal(t, plain, digestV1Of(withUserVolume), "a pod's own volumes are not part of the digest")

	wired := base.DeepCopy()
	wired.Spec.Volumes = []corev1.Volume{token(v1alpha1.IndexTokenAudience)}
	assert.NotEqual(t, plain, digestV1Of(wired), "the token volume is part of the digest")
	other := base.DeepCopy()
	other.Spec.Volumes = []corev1.Volume{token("https://kubernetes.default.svc")}
	assert.NotEqual(t, digestV1Of(wired), digestV1Of(other), "a token of another audience does not verify")
	assert.NotEqual(t, Digest(base), Digest(withUserVolume), "now a pod's own volumes are part of the digest")
	assert.NotEqual(t, Digest(wired), Digest(other))
}

// TestEventName: the receipt event's name is the same for a pod wherever
// it is computed, differs per pod UID, and cannot be derived without the
// operator's key (a pod creator who knows the UID still cannot take it).
func TestEventName(t *testing.T) {
	k := NewKey([]byte("operator secret"))
	other := NewKey([]byte("guessed secret"))
	long := strings.Repeat("p", 253)
	cases := []struct {
		name string
		a, b string
		same bool
	}{
		{"deterministic", EventName(k, "engine", "uid-1"), EventName(k, "engine", "uid-1"), true},
		{"per pod UID", EventName(k, "engine", "uid-1"), EventName(k, "engine", "uid-2"), false},
		{"keyed", EventName(k, "engine", "uid-1"), EventName(other, "engine", "uid-1"), false},
		{"not the unkeyed hash", EventName(k, "engine", "uid-1"), EventName(Key{}, "engine", "uid-1"), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.same, c.a == c.b, "%s vs %s", c.a, c.b)
			assert.True(t, strings.HasPrefix(c.a, "engine."), c.a)
		})
	}
	n := EventName(k, long, "uid-1")
	assert.LessOrEqual(t, len(n), 253, "a DNS subdomain")
	assert.Empty(t, validation.IsDNS1123Subdomain(n))
}
