package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/receipt"
)

// Outcomes of Explain.
const (
	ExplainInjected = "injected"
	ExplainSkipped  = "skipped"
	ExplainFailOpen = "fail-open"
	ExplainNoMatch  = "no-match"
	ExplainForged   = "forged-receipt"
	// ExplainUnverified: the receipt names the live CacheBackend, but
	// without the key its signature was not checked, so it may have been
	// written by hand: not called injected.
	ExplainUnverified = "unverified-receipt"
)

// States of an Explanation's receipt.
const (
	// ReceiptVerified: the receipt names the live CacheBackend and its
	// signature verifies with the operator's key.
	ReceiptVerified = "verified"
	// ReceiptFailed: the receipt names no live CacheBackend, another UID,
	// or its signature does not verify (outcome ExplainForged).
	ReceiptFailed = "failed"
	// ReceiptUnchecked: the receipt names the live CacheBackend, but the
	// key Secret could not be read to check its signature.
	ReceiptUnchecked = "unchecked"
	// ReceiptNone: the pod carries no receipt.
	ReceiptNone = "none"
)

// Generations of an injected pod's receipt against its CacheBackend.
const (
	GenerationCurrent = "current"
	GenerationStale   = "stale"
)

// Explanation says what happened to a pod at admission, and why.
type Explanation struct {
	Outcome string
	// Backend is the CacheBackend the pod's receipt or labels point at.
	Backend string
	// Receipt is one of the Receipt* states.
	Receipt string
	// Generation is GenerationCurrent or GenerationStale when the receipt
	// names the live CacheBackend, empty otherwise.
	Generation string
	// IndexState is the pod's state in the KV-block index, from the
	// backend's status.indexParticipation (empty without observation).
	IndexState string
	// Mode is the backend's mode (Mode* values), empty without a backend.
	Mode string
	// Connector is the kv_connector the pod's --kv-transfer-config names,
	// empty when it sets none.
	Connector string
	// WiringMismatch: the pod is wired with another connector than its
	// backend's mode wires (e.g. LMCacheConnectorV1 for a multiprocess
	// backend): it was wired before the mode changed.
	WiringMismatch bool
	// Node and NodeServer (NodeServer* values) are, in multiprocess mode,
	// the pod's node and the state of that node's server.
	Node, NodeServer string
	Lines            []string
}

// Print writes the explanation for a person.
func (e Explanation) Print(w io.Writer) {
	fmt.Fprintf(w, "Outcome:      %s\n", e.Outcome)
	if e.Backend != "" {
		fmt.Fprintf(w, "CacheBackend: %s\n", e.Backend)
	}
	if e.Mode != "" {
		fmt.Fprintf(w, "Mode:         %s\n", e.Mode)
	}
	if e.NodeServer != "" {
		fmt.Fprintf(w, "Node server:  %s\n", e.NodeServer)
	}
	if e.IndexState != "" {
		fmt.Fprintf(w, "Index:        %s\n", e.IndexState)
	}
	for _, l := range e.Lines {
		fmt.Fprintf(w, "  %s\n", l)
	}
}

// Explain reads a pod and the CacheBackends of its namespace and says
// whether the pod was injected, skipped, admitted unwired (fail-open), or
// matched nothing, and whether its receipt verifies. keys may be nil when
// the receipt key Secret cannot be read (keysErr says why); the signature
// is then not checked, and the explanation says so.
func Explain(ctx context.Context, c client.Reader, ns, name string, keys []receipt.Key, keysErr error) (Explanation, error) {
	pod := &corev1.Pod{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, pod); err != nil {
		return Explanation{}, fmt.Errorf("reading pod %s/%s: %w", ns, name, err)
	}
	var list v1alpha1.CacheBackendList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return Explanation{}, fmt.Errorf("listing CacheBackends in %s: %w", ns, err)
	}
	e := explain(pod, list.Items, keys, keysErr)
	var evs eventsv1.EventList
	if err := c.List(ctx, &evs, client.InNamespace(ns)); err == nil {
		for _, ev := range evs.Items {
			if ev.Regarding.Kind == "Pod" && ev.Regarding.Name == name && ev.Regarding.UID == pod.UID &&
				(ev.ReportingController == v1alpha1.ReportingController || ev.Reason == v1alpha1.EventInjected || ev.Reason == v1alpha1.EventSkipped || ev.Reason == v1alpha1.EventReceiptMismatch) {
				e.Lines = append(e.Lines, fmt.Sprintf("event: %s %s: %s", ev.Type, ev.Reason, ev.Note))
			}
		}
	}
	return e, nil
}

// explain classifies pod (explainAdmission) and, for a pod of a known
// backend that was not forged, says what the backend's mode means for it
// (describeMode).
func explain(pod *corev1.Pod, backends []v1alpha1.CacheBackend, keys []receipt.Key, keysErr error) Explanation {
	e := explainAdmission(pod, backends, keys, keysErr)
	if e.Backend == "" || e.Outcome == ExplainForged {
		return e
	}
	for i := range backends {
		if backends[i].Namespace+"/"+backends[i].Name == e.Backend {
			describeMode(pod, &backends[i], &e)
		}
	}
	return e
}

func explainAdmission(pod *corev1.Pod, backends []v1alpha1.CacheBackend, keys []receipt.Key, keysErr error) Explanation {
	a := pod.Annotations
	if c := receipt.ClaimOf(a); c.Backend != "" || c.UID != "" {
		var cb *v1alpha1.CacheBackend
		for i := range backends {
			if backends[i].Namespace+"/"+backends[i].Name == c.Backend {
				cb = &backends[i]
			}
		}
		e := Explanation{Backend: c.Backend, Receipt: ReceiptFailed}
		if cb != nil && c.UID == string(cb.UID) {
			e.Generation = GenerationStale
			if c.Generation == strconv.FormatInt(cb.Generation, 10) {
				e.Generation = GenerationCurrent
			}
		}
		j := receipt.Judge(pod, cb, keys)
		switch j.Verdict {
		case receipt.Valid:
			e.Outcome, e.Receipt = ExplainInjected, ReceiptVerified
			e.Lines = append(e.Lines, fmt.Sprintf("receipt verifies: wired by the webhook with generation %s of the CacheBackend (now %d)", c.Generation, cb.Generation))
		case receipt.Unverified:
			e.Outcome, e.Receipt = ExplainUnverified, ReceiptUnchecked
			e.Lines = append(e.Lines, fmt.Sprintf("%s: %v", j.Message, keysErr),
				"the receipt names this CacheBackend, but anyone who can create the pod could have written it: run with access to the receipt key Secret to tell")
		default:
			e.Outcome = ExplainForged
			e.Lines = append(e.Lines, j.Message)
		}
		if r := a[v1alpha1.AnnotationWiredFor]; r != "" && e.Outcome != ExplainForged {
			// Not signed: the digest covers the command line the release
			// decided.
			e.Lines = append(e.Lines, "wired for the engine releases "+r+" (annotation, image tag or spec.integration.versions; docs/compatibility.md)")
		}
		if r := a[v1alpha1.AnnotationKVEventsSkipped]; r != "" && e.Outcome != ExplainForged {
			e.Lines = append(e.Lines, kvEventsSkipped(r))
		}
		if e.Outcome == ExplainInjected {
			e.IndexState = indexState(pod, cb, &e)
		}
		return e
	}
	matched := v1alpha1.Claimant(pod.Labels, backends)
	name := ""
	if matched != nil {
		name = matched.Namespace + "/" + matched.Name
	}
	if skipped := a[v1alpha1.AnnotationInjectSkipped]; skipped != "" {
		e := Explanation{Outcome: ExplainSkipped, Backend: name, Receipt: ReceiptNone}
		switch skipped {
		case v1alpha1.SkippedByAnnotation:
			e.Lines = append(e.Lines, fmt.Sprintf("the pod opts out with %s=%q", v1alpha1.AnnotationSkipInject, a[v1alpha1.AnnotationSkipInject]))
		case v1alpha1.SkippedUserConfig:
			e.Lines = append(e.Lines, "the engine container sets its own LMCache/HiCache configuration, which the webhook never overwrites")
		case v1alpha1.SkippedShellWrapper:
			e.Lines = append(e.Lines, "the engine container runs a shell command line (sh -c), which the webhook cannot extend")
		case v1alpha1.SkippedIsolatedIPCUnsupported:
			e.Lines = append(e.Lines, "the engine container turns on PyTorch's expandable_segments, vLLM's sleep mode or vLLM's extensible KV cache, whose memory LMCache's isolated IPC (multiprocess mode) cannot share")
		case v1alpha1.SkippedChunkSizeMisaligned:
			e.Lines = append(e.Lines, "the engine's --block-size (times its decode context parallel size) does not divide the multiprocess server's chunk of 256 tokens, which LMCache's MP connector refuses at start")
		case v1alpha1.SkippedEngineRelease:
			e.Lines = append(e.Lines, "the engine runs LMCache 0.5.7 or later, which has no in-process connector: wire it to a CacheBackend in multiprocess mode")
		default:
			e.Lines = append(e.Lines, "skipped: "+skipped)
		}
		return e
	}
	if matched != nil {
		e := Explanation{Outcome: ExplainFailOpen, Backend: name, Receipt: ReceiptNone}
		e.Lines = append(e.Lines,
			"the pod's labels match this CacheBackend, but the pod carries no receipt: it was admitted unwired",
			"causes: the backend had no status.endpoint at admission, the webhook was unreachable, the pod was created before the operator knew the backend, or it was labelled after creation")
		fix := "fix: recreate the pod (kubectl rollout restart on its workload) once the backend is Ready"
		if matched.Spec.Type == v1alpha1.BackendTypeLMCache && matched.Status.Endpoint == "" {
			line, when := noEndpoint(matched)
			e.Lines = append(e.Lines, line)
			fix = "fix: recreate the pod (kubectl rollout restart on its workload) once " + when
		}
		e.Lines = append(e.Lines, fix)
		return e
	}
	e := Explanation{Outcome: ExplainNoMatch, Receipt: ReceiptNone}
	e.Lines = append(e.Lines, fmt.Sprintf("no CacheBackend's engineSelector matches the pod's labels %s", labelString(pod.Labels)))
	for _, cb := range backends {
		e.Lines = append(e.Lines, fmt.Sprintf("CacheBackend %s selects %s", cb.Name, labelString(cb.Spec.EngineSelector.MatchLabels)))
	}
	return e
}

// noEndpoint says why an LMCache backend publishes no endpoint now, and
// when it will. A multiprocess backend is Ready with no node selected for
// a server (a GPU pool scaled to zero must not hold a later sync wave),
// yet has no endpoint until a node's server is available: "wait until it
// is Ready" would send its user waiting for what already holds.
func noEndpoint(cb *v1alpha1.CacheBackend) (line, when string) {
	ready := meta.IsStatusConditionTrue(cb.Status.Conditions, v1alpha1.ConditionReady)
	switch mp := cb.Status.Multiprocess; {
	case mp != nil && mp.DesiredServers == 0:
		return "the backend has no endpoint now either: no node is selected for a multiprocess server (status.multiprocess.desiredServers 0); " +
				"the endpoint is published once a node its server's placement selects (spec.remoteStorage.lmCacheServer.pod) runs a ready server",
			"status.endpoint is published"
	case mp != nil:
		return fmt.Sprintf("the backend has no endpoint now either: %d of %d node servers ready; it is published once one is", mp.ReadyServers, mp.DesiredServers),
			"status.endpoint is published"
	case ready:
		return "the backend has no endpoint now either, though Ready: no server replica is available", "status.endpoint is published"
	}
	return "the backend has no endpoint now either: wait until it is Ready", "the backend is Ready"
}

// Index states of Explanation.IndexState beyond the v1alpha1.IndexPodState
// values.
const (
	// IndexNotObserved: the backend has no spec.observation.
	IndexNotObserved = "not-observed"
	// IndexNotPublished: observation is set but the status carries no
	// participation yet (the KV-event gate is closed or the index was
	// never read).
	IndexNotPublished = "unknown"
	// IndexNotListed: the pod is not among the worst pods listed; it is at
	// least as healthy as the last one listed.
	IndexNotListed = "not-listed"
)

// indexState reads the pod's line of the backend's indexParticipation (the
// CLI needs no access to the index itself) and explains it.
func indexState(pod *corev1.Pod, cb *v1alpha1.CacheBackend, e *Explanation) string {
	if cb.Spec.Observation == nil {
		return IndexNotObserved
	}
	cond := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionIndexSynced)
	p := cb.Status.IndexParticipation
	if cond != nil {
		e.Lines = append(e.Lines, fmt.Sprintf("KV-block index: %s pods live, IndexSynced=%s (%s): %s", valueOr(p), cond.Status, cond.Reason, cond.Message))
	}
	if p == nil {
		e.Lines = append(e.Lines, "index state: not published yet")
		return IndexNotPublished
	}
	for _, pp := range p.Pods {
		if pp.Name != pod.Name {
			continue
		}
		line := fmt.Sprintf("index state: %s, %d blocks", pp.State, pp.Blocks)
		if pp.LagMillis > 0 {
			line += fmt.Sprintf(", lag %d ms", pp.LagMillis)
		}
		if pp.SequenceGaps > 0 || pp.Resyncs > 0 {
			line += fmt.Sprintf(", %d gaps, %d resyncs", pp.SequenceGaps, pp.Resyncs)
		}
		if pp.HashCompatibility != "" {
			line += ", hashes " + string(pp.HashCompatibility)
		}
		if pp.Message != "" {
			line += ": " + pp.Message
		}
		e.Lines = append(e.Lines, line)
		return string(pp.State)
	}
	if len(p.Pods) > 0 && p.PodsTruncated {
		e.Lines = append(e.Lines, fmt.Sprintf("index state: not among the %d worst pods listed, so at least %s", len(p.Pods), p.Pods[len(p.Pods)-1].State))
		return IndexNotListed
	}
	e.Lines = append(e.Lines, "index state: not listed (the pod was not expected in the index when the status was written)")
	return IndexNotListed
}

func valueOr(p *v1alpha1.IndexParticipation) string {
	if p == nil || p.Indexed == "" {
		return "?"
	}
	return p.Indexed
}

// kvEventsSkipped says why a wired pod has no kvevent-subscriber sidecar
// (inject.KVEvents* reasons).
func kvEventsSkipped(reason string) string {
	why := map[string]string{
		v1alpha1.KVEventsUserConfig:   "the engine sets its own --kv-events-config, which the webhook keeps",
		v1alpha1.KVEventsDataParallel: "its data-parallel flags are ones the webhook cannot follow",
		v1alpha1.KVEventsNameTaken:    "the pod already has a container or volume of the sidecar's names",
		v1alpha1.KVEventsHostNetwork: "the pod uses the node's network (spec.hostNetwork), where the KV-event sockets would be reachable by every process on the node; " +
			"run the engine without hostNetwork to have it indexed",
	}[reason]
	if why == "" {
		why = reason
	}
	return fmt.Sprintf("no KV-event sidecar (%s=%s): %s; the cache is wired, the index does not see this pod", v1alpha1.AnnotationKVEventsSkipped, reason, why)
}

func labelString(m map[string]string) string {
	if len(m) == 0 {
		return "{} (nothing)"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// ReadKeys reads the receipt keys from the key Secret in the operator's
// namespace ns, with the operator's own parser (receipt.KeysFromSecret).
// Explain works without them: the caller passes the error on.
func ReadKeys(ctx context.Context, c client.Reader, ns string) ([]receipt.Key, error) {
	s := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: receipt.DefaultSecretName}, s); err != nil {
		return nil, fmt.Errorf("cannot read the receipt key Secret %s/%s: %w", ns, receipt.DefaultSecretName, err)
	}
	return receipt.KeysFromSecret(s)
}
