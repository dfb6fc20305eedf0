package receipt

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
)

func TestJudge(t *testing.T) {
	key := NewKey([]byte("0123456789abcdef0123456789abcdef"))
	cb := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "hicache", UID: "uid-1"}}
	signed := func(by, uid string) *corev1.Pod {
		p, _ := signedPod(key)
		p.Namespace = "llm"
		c := Claim{Backend: by, UID: uid, Generation: "2", Digest: Digest(p)}
		set := func(k, v string) {
			if v != "" {
				p.Annotations[k] = v
			}
		}
		set(v1alpha1.AnnotationInjectedBy, by)
		set(v1alpha1.AnnotationInjectedByUID, uid)
		set(v1alpha1.AnnotationInjectedGeneration, "2")
		p.Annotations[v1alpha1.AnnotationReceiptSignature] = Sign(key, c)
		return p
	}
	bare := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "llm"}}
	tampered := signed("llm/hicache", "uid-1")
	tampered.Spec.Containers[0].Args = nil
	forged := signed("llm/hicache", "uid-1")
	forged.Annotations[v1alpha1.AnnotationReceiptSignature] = Sign(NewKey([]byte("another key, not the operator's!")), ClaimOf(forged.Annotations))

	cases := []struct {
		name string
		pod  *corev1.Pod
		cb   *v1alpha1.CacheBackend
		keys []Key
		want Verdict
		// meta is JudgeMetadata's verdict, which cannot see the containers.
		meta Verdict
	}{
		{"no receipt", bare, cb, []Key{key}, Absent, Absent},
		{"injected-by without injected-by-uid", signed("llm/hicache", ""), cb, []Key{key}, Incomplete, Incomplete},
		{"injected-by-uid without injected-by", signed("", "uid-1"), cb, []Key{key}, Incomplete, Incomplete},
		{"another namespace", signed("other/hicache", "uid-1"), cb, []Key{key}, Foreign, Foreign},
		{"another backend", signed("llm/other", "uid-1"), cb, []Key{key}, Foreign, Foreign},
		{"a backend that does not exist", signed("llm/hicache", "uid-1"), nil, []Key{key}, NoBackend, NoBackend},
		{"another uid", signed("llm/hicache", "uid-2"), cb, []Key{key}, WrongUID, WrongUID},
		{"a configuration that differs", tampered, cb, []Key{key}, Untrusted, Valid},
		{"no keys to check", signed("llm/hicache", "uid-1"), cb, nil, Unverified, Unverified},
		{"a signature by another key", forged, cb, []Key{key}, Untrusted, Untrusted},
		{"valid", signed("llm/hicache", "uid-1"), cb, []Key{key}, Valid, Valid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			j := Judge(tc.pod, tc.cb, tc.keys)
			assert.Equal(t, tc.want, j.Verdict, j.Message)
			assert.NotEmpty(t, j.Message)
			m := JudgeMetadata(tc.pod.Namespace, tc.pod.Annotations, tc.cb, tc.keys)
			assert.Equal(t, tc.meta, m.Verdict, m.Message)
		})
	}
}

func TestKeysFromSecret(t *testing.T) {
	long := []byte("0123456789abcdef")
	for _, tc := range []struct {
		name    string
		data    map[string][]byte
		keys    int
		wantErr bool
	}{
		{"no key", nil, 0, true},
		{"a key one byte too short", map[string][]byte{SecretKeyCurrent: long[:MinKeyLength-1]}, 0, true},
		{"a key", map[string][]byte{SecretKeyCurrent: long}, 1, false},
		{"a key and a previous one", map[string][]byte{SecretKeyCurrent: long, SecretKeyPrevious: long}, 2, false},
		{"a short previous key is ignored", map[string][]byte{SecretKeyCurrent: long, SecretKeyPrevious: []byte("x")}, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keys, err := KeysFromSecret(&corev1.Secret{Data: tc.data})
			if tc.wantErr {
				assert.Error(t, err)
				return
			}
			assert.NoError(t, err)
			assert.Len(t, keys, tc.keys)
		})
	}
}
