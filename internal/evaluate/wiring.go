package evaluate

import (
	"fmt"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/receipt"
)

// Wiring is the tally of a backend's matched engine pods by what their
// metadata proves: the input of status.wiredEnginePods,
// status.unwiredEnginePods, condition EnginesWired and the healing roll.
type Wiring struct {
	// Wired counts pods whose receipt signature verifies for the backend
	// (receipt.JudgeMetadata: the metadata cache holds no containers).
	Wired int32
	// Skipped counts pods left unwired on purpose (the webhook's
	// inferencecache.io/inject-skipped, or the pod's own truthy
	// inferencecache.io/skip-inject): never counted unwired, never rolled.
	Skipped int32
	// Early are the unwired pods without any receipt that were created
	// before the endpoint settled: admitted while the webhook had no
	// endpoint to inject. Healing rolls their workloads.
	Early []metav1.PartialObjectMetadata
	// Late are the other unwired pods: no receipt although the endpoint
	// had settled, or a receipt that does not verify (forged, copied, of a
	// deleted backend). Reported only: a roll would not be known to help,
	// and a pod's own annotations must never trigger one.
	Late []metav1.PartialObjectMetadata
	// KeysUnavailable: a receipt naming the backend could not be verified
	// for want of keys.
	KeysUnavailable bool
}

// Unwired is status.unwiredEnginePods.
func (w Wiring) Unwired() int32 { return int32(len(w.Early) + len(w.Late)) }

// TallyWiring classifies the non-terminating pods the engine selector of cb
// matches. endpointSince is when the endpoint became usable by the webhook
// (the backend's Ready transition plus the settle time), nil while cb
// publishes none; a pod created before it was admitted with no endpoint to
// inject. keys nil means they could not be read (only receipts naming cb
// need them).
func TallyWiring(cb *v1alpha1.CacheBackend, pods []metav1.PartialObjectMetadata, keys []receipt.Key, endpointSince *time.Time) Wiring {
	var w Wiring
	for i := range pods {
		p := &pods[i]
		if !p.DeletionTimestamp.IsZero() {
			continue
		}
		a := p.Annotations
		// A pod that asks for skip-inject is skipped even without the
		// webhook's stamp (admitted before the webhook knew the backend).
		if (a[v1alpha1.AnnotationInjectSkipped] != "" || inject.SkipRequested(a[v1alpha1.AnnotationSkipInject])) && a[v1alpha1.AnnotationInjectedBy] == "" {
			w.Skipped++
			continue
		}
		j := receipt.JudgeMetadata(p.Namespace, a, cb, keys)
		switch {
		case j.Verdict == receipt.Valid:
			w.Wired++
		case keys == nil && j.Verdict == receipt.Unverified:
			// Not countable either way until the keys are read.
			w.KeysUnavailable = true
		case j.Verdict == receipt.Absent && (endpointSince == nil || p.CreationTimestamp.Time.Before(*endpointSince)):
			w.Early = append(w.Early, *p)
		default:
			w.Late = append(w.Late, *p)
		}
	}
	return w
}

// WiringReport is condition EnginesWired's status, reason and message.
type WiringReport struct {
	Status  metav1.ConditionStatus
	Reason  string
	Message string
}

// WiringFacts are what the report needs beyond the tally: the workloads
// (as "Deployment/name", "StatefulSet/name", or "Pod/name" for a pod of
// neither) of the early and late pods, and which early workloads already
// carry the healing roll.
type WiringFacts struct {
	Wiring
	Policy     v1alpha1.EngineRestartPolicy
	EngineLoc  bool
	Endpoint   bool
	EarlyOwner []string
	LateOwner  []string
	// Rolling: every early workload has been rolled for the current server
	// instance; its unwired pods are being replaced.
	Rolling bool
}

// ReportWiring decides condition EnginesWired. The order of the cases is
// the precedence of the reasons.
func ReportWiring(f WiringFacts) WiringReport {
	total := f.Wired + f.Unwired()
	switch {
	case f.KeysUnavailable:
		return WiringReport{metav1.ConditionUnknown, v1alpha1.ReasonReceiptKeysUnavailable,
			"the receipt keys could not be read: no receipt verified"}
	case len(f.Early) > 0 && !f.EngineLoc:
		heal := "the operator rolls them once per pod template when the endpoint has settled"
		switch {
		case f.Policy == v1alpha1.EngineRestartNever:
			heal = "engineRestartPolicy is Never: restart them (kubectl rollout restart) to wire them"
		case f.Rolling:
			return WiringReport{metav1.ConditionFalse, v1alpha1.ReasonEnginesRollingForWiring,
				fmt.Sprintf("%d of %d engine pod(s) admitted before the endpoint existed are being replaced: rolled %s", f.Unwired(), total, workloads(f.EarlyOwner))}
		case !f.Endpoint:
			heal = "no endpoint is published yet; the operator rolls them once it has settled"
		}
		return WiringReport{metav1.ConditionFalse, v1alpha1.ReasonEnginesAdmittedBeforeEndpoint,
			fmt.Sprintf("%d of %d engine pod(s) admitted before the endpoint existed, unwired: %s; %s", len(f.Early), total, workloads(f.EarlyOwner), heal)}
	case f.Unwired() > 0:
		return WiringReport{metav1.ConditionFalse, v1alpha1.ReasonEnginesAdmittedUnwired,
			fmt.Sprintf("%d of %d engine pod(s) unwired without a skip (no receipt, or one that does not verify): %s; see kubectl cachebackend explain pod", f.Unwired(), total, workloads(append(append([]string{}, f.EarlyOwner...), f.LateOwner...)))}
	}
	return WiringReport{metav1.ConditionTrue, v1alpha1.ReasonAllEnginesWired,
		fmt.Sprintf("%d engine pod(s) wired, %d skipped on purpose", f.Wired, f.Skipped)}
}

// workloads lists distinct workload names, sorted.
func workloads(ws []string) string {
	seen := map[string]bool{}
	var out []string
	for _, w := range ws {
		if !seen[w] {
			seen[w] = true
			out = append(out, w)
		}
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}
