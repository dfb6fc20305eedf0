package receipt

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// Verdict is what a pod's receipt proves about a CacheBackend.
type Verdict string

// Verdicts of Judge, from no receipt at all to a verified one.
const (
	// Absent: the pod carries neither injected-by nor injected-by-uid.
	Absent Verdict = "Absent"
	// Incomplete: one of injected-by and injected-by-uid without the other.
	Incomplete Verdict = "Incomplete"
	// Foreign: the receipt names another CacheBackend than the one judged
	// (or one outside the pod's namespace).
	Foreign Verdict = "Foreign"
	// NoBackend: the receipt names a CacheBackend that does not exist.
	NoBackend Verdict = "NoBackend"
	// WrongUID: the receipt names the CacheBackend with another uid (a
	// receipt copied, or one of a deleted backend of the same name).
	WrongUID Verdict = "WrongUID"
	// Untrusted: the signature or the configuration digest does not verify.
	Untrusted Verdict = "Untrusted"
	// Unverified: the identity matches; no keys were given to check the
	// signature.
	Unverified Verdict = "Unverified"
	// Valid: the identity matches and the signature verifies.
	Valid Verdict = "Valid"
)

// Judgement is the verdict on one pod's receipt, with the claim read and a
// message for a person.
type Judgement struct {
	Verdict Verdict
	Claim   Claim
	// Err is Verify's error for Untrusted.
	Err     error
	Message string
}

// Judge checks the receipt pod carries against cb, the CacheBackend it is
// judged for (nil when the one the receipt names does not exist). With nil
// keys the signature is not checked (Unverified instead of Valid). It is the
// one receipt verdict of the operator: the receipts controller, the
// engine-local readiness and the CLI's explain all call it.
func Judge(pod *corev1.Pod, cb *v1alpha1.CacheBackend, keys []Key) Judgement {
	return judge(pod, cb, keys, func() string { return Digest(pod) })
}

// JudgeObserved is Judge for a pod whose containers are not at hand, only
// their Digest, computed when the pod was observed: the receipt
// controller's view of pods keeps the digest and drops the containers, so
// that judging a receipt costs no request for the full pod. pod supplies
// the namespace and annotations.
func JudgeObserved(pod *corev1.Pod, digest string, cb *v1alpha1.CacheBackend, keys []Key) Judgement {
	return judge(pod, cb, keys, func() string { return digest })
}

func judge(pod *corev1.Pod, cb *v1alpha1.CacheBackend, keys []Key, digest func() string) Judgement {
	c := ClaimOf(pod.Annotations)
	j := Judgement{Claim: c}
	switch {
	case c.Backend == "" && c.UID == "":
		j.Verdict, j.Message = Absent, "the pod carries no injection receipt"
		return j
	case c.Backend == "" || c.UID == "":
		j.Verdict = Incomplete
		j.Message = fmt.Sprintf("the receipt is incomplete: %s=%q, %s=%q", v1alpha1.AnnotationInjectedBy, c.Backend, v1alpha1.AnnotationInjectedByUID, c.UID)
		return j
	}
	if ns, name, ok := strings.Cut(c.Backend, "/"); !ok || ns != pod.Namespace || name == "" {
		j.Verdict = Foreign
		j.Message = fmt.Sprintf("receipt %s=%q does not name a CacheBackend of this namespace", v1alpha1.AnnotationInjectedBy, c.Backend)
		return j
	}
	if cb == nil {
		j.Verdict = NoBackend
		j.Message = fmt.Sprintf("receipt names CacheBackend %s, which does not exist (deleted, or a receipt copied from elsewhere)", c.Backend)
		return j
	}
	if want := cb.Namespace + "/" + cb.Name; c.Backend != want {
		j.Verdict = Foreign
		j.Message = fmt.Sprintf("the receipt names CacheBackend %s, not %s", c.Backend, want)
		return j
	}
	if c.UID != string(cb.UID) {
		j.Verdict = WrongUID
		j.Message = fmt.Sprintf("receipt names CacheBackend %s with uid %q, but its uid is %q: the receipt was not written by the webhook for this backend", c.Backend, c.UID, cb.UID)
		return j
	}
	if keys == nil {
		j.Verdict = Unverified
		j.Message = fmt.Sprintf("receipt names the live CacheBackend %s (generation %s); signature not checked", c.Backend, c.Generation)
		return j
	}
	if err := verify(keys, pod, c, digest); err != nil {
		j.Verdict, j.Err = Untrusted, err
		j.Message = fmt.Sprintf("receipt for CacheBackend %s not trusted: %v", c.Backend, err)
		return j
	}
	j.Verdict = Valid
	j.Message = fmt.Sprintf("wired to CacheBackend %s (generation %s)", c.Backend, c.Generation)
	return j
}
