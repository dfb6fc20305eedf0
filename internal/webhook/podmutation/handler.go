package podmutation

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/receipt"
)

// Decisions counts the webhook's verdicts by outcome and reason.
var Decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "inferencecache_webhook_decisions_total",
	Help: "Pod admission decisions of the injection webhook, by outcome (injected, skipped, fail-open, no-match) and reason.",
}, []string{"outcome", "reason"})

func init() { metrics.Registry.MustRegister(Decisions) }

// MutatePath is where the Pod webhook is served.
const MutatePath = "/mutate-v1-pod"

// +kubebuilder:webhookconfiguration:mutating=true,name=inferencecache-pod-injector
// +kubebuilder:webhook:path=/mutate-v1-pod,mutating=true,failurePolicy=ignore,sideEffects=None,groups="",resources=pods,verbs=create,versions=v1,name=inject.inferencecache.io,admissionReviewVersions=v1,timeoutSeconds=5,reinvocationPolicy=Never

// Handler is the mutating Pod webhook. It never rejects a pod: every error
// admits the pod unchanged with a warning.
type Handler struct {
	// Backends, when set and synced, selects the CacheBackend of a pod
	// (the manager keeps it from the CacheBackend informer); otherwise
	// Reader lists the CacheBackends of the pod's namespace.
	Backends *Index
	// Reader lists the CacheBackends of the pod's namespace (the manager's cache).
	Reader  client.Reader
	Options inject.Options
	// Keys, when set, provides the key that signs receipts.
	Keys *receipt.KeyRing
}

// Handle implements admission.Handler, for callers that hold a decoded
// admission.Request; the manager serves Review, which reads the request's
// bytes itself.
func (h *Handler) Handle(ctx context.Context, req admission.Request) admission.Response {
	in := admissionInput{UID: req.UID, Kind: req.Kind, Namespace: req.Namespace, Name: req.Name, Operation: req.Operation, DryRun: req.DryRun != nil && *req.DryRun}
	in.Object, in.objectErr = inject.ReadObject(req.Object.Raw)
	return h.admit(ctx, in)
}

// admissionInput is what a decision reads of an admission request.
type admissionInput struct {
	UID       types.UID
	Kind      metav1.GroupVersionKind
	Namespace string
	Name      string
	Operation admissionv1.Operation
	DryRun    bool
	Object    inject.Object
	// objectErr is why the pod could not be read (Object is then empty).
	objectErr error
}

// podName names the pod on log lines: the request's name, else the pod's,
// else its generateName and a star.
func (in *admissionInput) podName() string {
	if in.Name != "" {
		return in.Name
	}
	if m := in.Object.Metadata; m != nil {
		if m.Name != "" {
			return m.Name
		}
		return m.GenerateName + "*"
	}
	return "*"
}

// admit decides one admission request, for Review and Handle alike.
func (h *Handler) admit(ctx context.Context, in admissionInput) (resp admission.Response) {
	// The pod's name is looked up only when there is something to log.
	logger := func() logr.Logger {
		return log.FromContext(ctx).WithValues("pod", in.Namespace+"/"+in.podName(), "requestID", in.UID)
	}
	defer func() {
		if r := recover(); r != nil {
			logger().Error(fmt.Errorf("panic: %v", r), "injection failed; admitting the pod unwired")
			resp = failOpen(in.Object, fmt.Sprintf("internal error: %v", r))
		}
	}()
	if in.Operation != admissionv1.Create || in.Kind.Kind != "Pod" {
		return admission.Allowed("")
	}
	if in.Namespace == "" {
		// The API server always names a pod's namespace. Without one, the
		// list below would read the CacheBackends of every namespace and
		// wire the pod to another namespace's cache: refuse the request.
		return admission.Errored(http.StatusBadRequest, errors.New("pod admission request without a namespace"))
	}
	if in.objectErr != nil {
		logger().Error(in.objectErr, "reading the pod; admitting the pod unchanged")
		return failOpen(inject.Object{}, in.objectErr.Error())
	}
	backends, done, resp := h.candidates(ctx, &in, logger)
	if done {
		return resp
	}
	opts := h.Options
	if h.Keys != nil && in.DryRun {
		// A dry run has no side effects: sign with the key held, if any,
		// and never create the key Secret.
		if k, ok := h.Keys.Held(); ok {
			opts.Key = &k
		}
	} else if h.Keys != nil {
		k, err := h.Keys.Signing(ctx)
		if err != nil {
			// Wire the pod anyway: an unsigned receipt only means the
			// readiness evaluator will not count the pod until it rolls.
			logger().Error(err, "receipt key unavailable; the receipt will not be signed")
		} else {
			opts.Key = &k
		}
	}
	if err := ctx.Err(); err != nil {
		// The API server gave up on this call (its timeout): do no more work.
		return failOpen(in.Object, "the admission request was cancelled: "+err.Error())
	}
	d, patch, err := inject.AdmitObject(in.Object, backends, opts)
	if err != nil {
		logger().Error(err, "computing the injection; admitting the pod unwired")
		return failOpen(in.Object, err.Error())
	}
	if !in.DryRun {
		Decisions.WithLabelValues(string(d.Outcome), d.Reason).Inc()
	}
	if d.Outcome != inject.NoMatch {
		log.FromContext(ctx).Info("admission decision", "pod", in.Namespace+"/"+decidedName(d.Pod), "requestID", in.UID, "outcome", d.Outcome, "reason", d.Reason, "cachebackend", d.Backend.Name, "dryRun", in.DryRun, "message", d.Message)
	}
	resp = admission.Patched("", patch...)
	if len(patch) == 0 {
		resp = admission.Allowed("")
	}
	if d.Outcome == inject.Skipped || d.Outcome == inject.FailOpen {
		resp.Warnings = append(resp.Warnings, "inferencecache: "+d.Message)
	}
	return resp
}

// candidates returns the CacheBackends inject.AdmitObject decides among.
// With a synced Index it selects by the pod's labels and hands
// inject.AdmitObject the one backend that claims the pod; a pod none
// claims and that carries none of the annotations the webhook strips is
// answered here (done), without decoding its spec. Without the Index it
// lists the namespace.
func (h *Handler) candidates(ctx context.Context, in *admissionInput, logger func() logr.Logger) ([]v1alpha1.CacheBackend, bool, admission.Response) {
	if h.Backends == nil || !h.Backends.Synced() {
		var list v1alpha1.CacheBackendList
		if err := h.Reader.List(ctx, &list, client.InNamespace(in.Namespace)); err != nil {
			logger().Error(err, "listing CacheBackends; admitting the pod unwired")
			return nil, true, failOpen(in.Object, "listing CacheBackends: "+err.Error())
		}
		return list.Items, false, admission.Response{}
	}
	cb := h.Backends.Select(in.Namespace, in.Object.Labels())
	switch {
	case cb != nil:
		return []v1alpha1.CacheBackend{*cb}, false, admission.Response{}
	case in.Object.Stripped():
		return nil, false, admission.Response{}
	}
	if !in.DryRun {
		Decisions.WithLabelValues(string(inject.NoMatch), "").Inc()
	}
	return nil, true, admission.Allowed("")
}

// failOpen admits the pod unwired, with a warning saying why. When the
// pod's metadata was read (o), the annotations the webhook strips from
// every pod (a pre-set receipt) are removed all the same, so that no
// failure admits a forged receipt; an unread pod (the zero Object) is
// admitted unchanged.
func failOpen(o inject.Object, msg string) admission.Response {
	Decisions.WithLabelValues(string(inject.FailOpen), v1alpha1.FailOpenInternalError).Inc()
	r := admission.Allowed("")
	if ops := inject.StripPatch(o); len(ops) > 0 {
		r = admission.Patched("", ops...)
	}
	r.Warnings = []string{"inferencecache: pod admitted without cache wiring: " + msg}
	return r
}

// decidedName is the name of the pod inject.Admit decoded, as podName reports it.
func decidedName(p *corev1.Pod) string {
	if p.Name != "" {
		return p.Name
	}
	return p.GenerateName + "*"
}
