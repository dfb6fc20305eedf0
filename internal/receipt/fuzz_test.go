package receipt

import (
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// FuzzVerify: for any pod, claim and signature annotation, Verify never
// panics, and it accepts only a signature that the key made for exactly
// that claim over exactly that pod's containers. A signature made for one
// claim never verifies another (the payload is injective).
func FuzzVerify(f *testing.F) {
	f.Add(`{"spec":{"containers":[{"name":"vllm","args":["--x"]}]}}`, "ns/cb", "uid", "1", "", "", "ns/cb", "uid", "1")
	f.Add(`{}`, "ns/cb\nuid", "1", "2", "x:00", "sha256:", "ns/cb", "uid\n1", "2")
	f.Add(`{"spec":{"initContainers":[{"name":"i"}]}}`, "", "", "", ":", "", "a", "b", "c")
	key := NewKey([]byte("0123456789abcdef0123456789abcdef"))
	f.Fuzz(func(t *testing.T, podJSON, backend, uid, gen, sig, digest, signedBackend, signedUID, signedGen string) {
		pod := &corev1.Pod{}
		if json.Unmarshal([]byte(podJSON), pod) != nil {
			return
		}
		if digest == "" {
			digest = Digest(pod)
		}
		c := Claim{Backend: backend, UID: uid, Generation: gen, Digest: digest}
		signed := Claim{Backend: signedBackend, UID: signedUID, Generation: signedGen, Digest: digest}
		for _, s := range []string{sig, Sign(key, signed)} {
			if pod.Annotations == nil {
				pod.Annotations = map[string]string{}
			}
			pod.Annotations[v1alpha1.AnnotationReceiptSignature] = s
			err := Verify([]Key{key}, pod, c)
			if err != nil {
				continue
			}
			if s != Sign(key, c) {
				t.Fatalf("verified a signature %q that the key did not make for claim %q", s, c)
			}
			if c != signed && s == Sign(key, signed) {
				t.Fatalf("the signature of %q verifies the different claim %q", signed, c)
			}
			if Digest(pod) != c.Digest {
				t.Fatalf("verified a receipt whose digest %q is not the pod's", c.Digest)
			}
		}
	})
}
