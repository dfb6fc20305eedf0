package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/version"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
)

// Names of the installed operator (kustomize/base). They are what check and
// version look for.
const (
	DefaultOperatorNamespace = "inferencecache-system"
	ManagerDeployment        = "inferencecache-operator"
	ManagerContainer         = "manager"
	CRDName                  = "cachebackends.inferencecache.io"
	PodWebhookConfig         = "inferencecache-pod-injector"
	BackendWebhookConfig     = "inferencecache-cachebackend-validator"
	BackendWebhookName       = "validate.cachebackend.inferencecache.io"
	// LabelVersion is the well-known label with an object's release version.
	LabelVersion = "app.kubernetes.io/version"
	// annotationInjectCA is cert-manager's CA injector annotation, which the
	// production overlay puts on the webhook configurations.
	annotationInjectCA = "cert-manager.io/inject-ca-from"
)

// MinKubernetesMinor is the oldest Kubernetes 1.x minor the install supports:
// the CRD's CEL rules and the admission features it relies on are GA there.
const MinKubernetesMinor = 30

// cert-manager's kinds that overlays/production uses.
var certManagerCRDs = []string{"certificates.cert-manager.io", "issuers.cert-manager.io"}

// Values of CheckOptions.CertManager.
const (
	CertManagerAuto     = "auto"
	CertManagerRequired = "true"
	CertManagerIgnored  = "false"
)

// CheckOptions select the checks.
type CheckOptions struct {
	// Pre checks the prerequisites of an install instead of an install.
	Pre bool
	// Namespace receives the dry-run CacheBackend and Pod; the Pod webhook
	// must not exclude it.
	Namespace string
	// OperatorNamespace holds the manager Deployment and webhook Service.
	OperatorNamespace string
	// CertManager: CertManagerAuto (required when the installed webhook
	// configurations ask cert-manager for their CA; reported but not
	// required before an install), CertManagerRequired or CertManagerIgnored.
	CertManager string
}

// CheckResult is one row of check's table.
type CheckResult struct {
	Name string
	// OK false is a failure; Warning marks a passing row worth reading.
	OK      bool
	Warning bool
	Detail  string
}

// Failed reports whether any result failed.
func Failed(results []CheckResult) bool {
	return slices.ContainsFunc(results, func(r CheckResult) bool { return !r.OK })
}

// PrintChecks writes results as a table with ✔, ✗ or ! for a warning.
func PrintChecks(w io.Writer, results []CheckResult) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	for _, r := range results {
		mark := "✔"
		switch {
		case !r.OK:
			mark = "✗"
		case r.Warning:
			mark = "!"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", mark, r.Name, r.Detail)
	}
	return tw.Flush()
}

// CheckInstall runs the checks against the cluster behind c. serverVersion is
// the discovery call for the cluster's version. The dry runs write nothing.
func CheckInstall(ctx context.Context, c client.Client, serverVersion func() (*version.Info, error), o CheckOptions) []CheckResult {
	if o.OperatorNamespace == "" {
		o.OperatorNamespace = DefaultOperatorNamespace
	}
	if o.CertManager == "" {
		o.CertManager = CertManagerAuto
	}
	if o.Namespace == "" {
		o.Namespace = "default"
	}
	out := []CheckResult{checkVersion(serverVersion)}
	if !out[0].OK && strings.Contains(out[0].Detail, "cannot reach") {
		return out
	}
	if o.Pre {
		out = append(out, checkPermissions(ctx, c))
		if o.CertManager != CertManagerIgnored {
			out = append(out, checkCertManager(ctx, c, o.CertManager == CertManagerRequired,
				"not installed: overlays/production needs it (install it first), overlays/dev does not"))
		}
		return out
	}
	out = append(out, checkCRD(ctx, c))
	webhooks, whResults := checkWebhooks(ctx, c)
	switch o.CertManager {
	case CertManagerRequired:
		out = append(out, checkCertManager(ctx, c, true, ""))
	case CertManagerAuto:
		if webhooks.certManager {
			out = append(out, checkCertManager(ctx, c, true, ""))
		}
	}
	out = append(out, checkManager(ctx, c, o.OperatorNamespace, webhooks.url))
	out = append(out, whResults...)
	out = append(out, checkBackendWebhook(ctx, c, o.Namespace), checkPodWebhook(ctx, c, o.Namespace))
	return out
}

func checkVersion(serverVersion func() (*version.Info, error)) CheckResult {
	r := CheckResult{Name: "Kubernetes version"}
	v, err := serverVersion()
	if err != nil {
		r.Detail = fmt.Sprintf("cannot reach the API server: %v", err)
		return r
	}
	major, minor, ok := KubernetesMinor(v)
	if !ok {
		// A server built without version stamps (as from source) says
		// v0.0.0: not a reason to fail an install.
		r.OK, r.Warning = true, true
		r.Detail = fmt.Sprintf("%s: version not stamped; needs >= 1.%d", v.GitVersion, MinKubernetesMinor)
		return r
	}
	r.OK = major == 1 && minor >= MinKubernetesMinor
	r.Detail = fmt.Sprintf("%d.%d (%s), needs >= 1.%d", major, minor, v.GitVersion, MinKubernetesMinor)
	return r
}

// KubernetesMinor reads a server's major and minor version: the binary
// version, else the version it emulates, else its git version.
func KubernetesMinor(v *version.Info) (major, minor int, ok bool) {
	parse := func(ma, mi string) bool {
		var err1, err2 error
		major, err1 = strconv.Atoi(ma)
		minor, err2 = strconv.Atoi(strings.TrimRight(mi, "+"))
		return err1 == nil && err2 == nil && major > 0
	}
	if parse(v.Major, v.Minor) || parse(v.EmulationMajor, v.EmulationMinor) {
		return major, minor, true
	}
	parts := strings.SplitN(strings.TrimPrefix(v.GitVersion, "v"), ".", 3)
	if len(parts) >= 2 && parse(parts[0], parts[1]) {
		return major, minor, true
	}
	return 0, 0, false
}

// checkPermissions asks the API server whether the caller may create the
// cluster-scoped kinds an install creates.
func checkPermissions(ctx context.Context, c client.Client) CheckResult {
	r := CheckResult{Name: "permission to install"}
	var missing []string
	for _, res := range []authorizationv1.ResourceAttributes{
		{Verb: "create", Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"},
		{Verb: "create", Group: "rbac.authorization.k8s.io", Resource: "clusterroles"},
		{Verb: "create", Group: "admissionregistration.k8s.io", Resource: "mutatingwebhookconfigurations"},
		{Verb: "create", Group: "admissionregistration.k8s.io", Resource: "validatingwebhookconfigurations"},
		{Verb: "create", Resource: "namespaces"},
	} {
		review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &res}}
		if err := c.Create(ctx, review); err != nil {
			r.Detail = fmt.Sprintf("cannot ask the API server: %v", err)
			return r
		}
		if !review.Status.Allowed {
			missing = append(missing, res.Resource)
		}
	}
	if len(missing) > 0 {
		r.Detail = "may not create " + strings.Join(missing, ", ")
		return r
	}
	r.OK, r.Detail = true, "may create CRDs, ClusterRoles, webhook configurations and namespaces"
	return r
}

// checkCertManager looks for cert-manager's CRDs. When not required, their
// absence is a warning saying absentNote.
func checkCertManager(ctx context.Context, c client.Client, required bool, absentNote string) CheckResult {
	r := CheckResult{Name: "cert-manager"}
	var missing []string
	for _, name := range certManagerCRDs {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		err := c.Get(ctx, client.ObjectKey{Name: name}, crd)
		switch {
		case apierrors.IsNotFound(err):
			missing = append(missing, name)
		case err != nil:
			r.Detail = fmt.Sprintf("reading CRD %s: %v", name, err)
			return r
		case !established(crd):
			missing = append(missing, name+" (not established)")
		}
	}
	if len(missing) == 0 {
		r.OK, r.Detail = true, "CRDs "+strings.Join(certManagerCRDs, ", ")+" present"
		return r
	}
	if !required {
		r.OK, r.Warning, r.Detail = true, true, absentNote
		return r
	}
	r.Detail = "missing " + strings.Join(missing, ", ") + ": the webhook certificate comes from cert-manager"
	return r
}

func established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, cond := range crd.Status.Conditions {
		if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}

func checkCRD(ctx context.Context, c client.Client) CheckResult {
	r := CheckResult{Name: "CRD " + CRDName}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := c.Get(ctx, client.ObjectKey{Name: CRDName}, crd); err != nil {
		if apierrors.IsNotFound(err) {
			r.Detail = "not installed"
		} else {
			r.Detail = err.Error()
		}
		return r
	}
	var served []string
	stored := ""
	for _, v := range crd.Spec.Versions {
		if v.Served {
			served = append(served, v.Name)
		}
		if v.Storage {
			stored = v.Name
		}
	}
	want := v1alpha1.GroupVersion.Version
	r.Detail = fmt.Sprintf("served %s, stored %s", strings.Join(served, ","), stored)
	switch {
	case !established(crd):
		r.Detail += ", not established"
	case !slices.Contains(served, want):
		r.Detail += fmt.Sprintf(", %s not served (this CLI speaks %s)", want, want)
	default:
		r.OK = true
	}
	return r
}

// checkManager checks the manager Deployment in ns. webhookURL is the
// URL the webhook configurations call, "" when they call a Service: a
// manager run outside the cluster (as `make demo` runs it) has no
// Deployment, which is then a warning, not a failure; the dry runs that
// follow prove that it answers.
func checkManager(ctx context.Context, c client.Client, ns, webhookURL string) CheckResult {
	r := CheckResult{Name: "manager Deployment " + ns + "/" + ManagerDeployment}
	d := &appsv1.Deployment{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: ManagerDeployment}, d); err != nil {
		switch {
		case apierrors.IsNotFound(err) && webhookURL != "":
			r.OK, r.Warning = true, true
			r.Detail = "not found: the webhooks are called at " + webhookURL + ", a manager outside the cluster (as make demo runs it); the dry runs below show whether it answers"
		case apierrors.IsNotFound(err):
			r.Detail = "not found"
		default:
			r.Detail = err.Error()
		}
		return r
	}
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	r.Detail = fmt.Sprintf("%d/%d available", d.Status.AvailableReplicas, want)
	available := false
	for _, cond := range d.Status.Conditions {
		if cond.Type == appsv1.DeploymentAvailable && cond.Status == corev1.ConditionTrue {
			available = true
		}
	}
	switch {
	case d.Status.ObservedGeneration < d.Generation:
		r.Detail += ", rollout not observed yet"
	case !available || d.Status.AvailableReplicas == 0:
		r.Detail += ", not Available"
	default:
		r.OK = true
	}
	return r
}

// webhookFacts is what the webhook checks learnt for the others.
type webhookFacts struct {
	certManager bool
	// url is the URL a webhook is called at, "" when every one calls a
	// Service.
	url string
}

// checkWebhooks finds the two webhook configurations and, for each webhook
// served through a Service, whether the Service has ready endpoints.
func checkWebhooks(ctx context.Context, c client.Client) (webhookFacts, []CheckResult) {
	var facts webhookFacts
	var out []CheckResult
	type hook struct {
		name   string
		config admissionregistrationv1.WebhookClientConfig
	}
	read := func(kind, name string, obj client.Object, hooks func() []hook) {
		r := CheckResult{Name: kind + " " + name}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, obj); err != nil {
			r.Detail = err.Error()
			if apierrors.IsNotFound(err) {
				r.Detail = "not installed"
			}
			out = append(out, r)
			return
		}
		if obj.GetAnnotations()[annotationInjectCA] != "" {
			facts.certManager = true
		}
		var details []string
		r.OK = true
		for _, h := range hooks() {
			if h.config.Service == nil && h.config.URL != nil && facts.url == "" {
				facts.url = *h.config.URL
			}
			ok, d := webhookServed(ctx, c, h.config)
			r.OK = r.OK && ok
			details = append(details, h.name+": "+d)
		}
		r.Detail = strings.Join(details, "; ")
		out = append(out, r)
	}
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
	read("MutatingWebhookConfiguration", PodWebhookConfig, mwc, func() []hook {
		var hs []hook
		for _, w := range mwc.Webhooks {
			hs = append(hs, hook{w.Name, w.ClientConfig})
		}
		return hs
	})
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	read("ValidatingWebhookConfiguration", BackendWebhookConfig, vwc, func() []hook {
		var hs []hook
		for _, w := range vwc.Webhooks {
			hs = append(hs, hook{w.Name, w.ClientConfig})
		}
		return hs
	})
	return facts, out
}

// webhookServed reports whether a webhook's Service exists with at least
// one ready endpoint in its EndpointSlices. A webhook called by URL has no
// Service to check; the dry runs prove it answers.
func webhookServed(ctx context.Context, c client.Client, cc admissionregistrationv1.WebhookClientConfig) (bool, string) {
	if cc.Service == nil {
		if cc.URL != nil {
			return true, "called at " + *cc.URL
		}
		return false, "no Service and no URL"
	}
	ok, detail := ServiceReady(ctx, c, cc.Service.Namespace, cc.Service.Name)
	if len(cc.CABundle) == 0 {
		return false, detail + ", no caBundle"
	}
	return ok, detail
}

// ServiceReady reports whether Service ns/name exists and its EndpointSlices
// hold at least one ready endpoint.
func ServiceReady(ctx context.Context, c client.Client, ns, name string) (bool, string) {
	subject := "Service " + ns + "/" + name
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &corev1.Service{}); err != nil {
		if apierrors.IsNotFound(err) {
			return false, subject + " not found"
		}
		return false, err.Error()
	}
	var slices discoveryv1.EndpointSliceList
	if err := c.List(ctx, &slices, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: name}); err != nil {
		return false, fmt.Sprintf("listing EndpointSlices of %s: %v", subject, err)
	}
	ready := 0
	for _, s := range slices.Items {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready == nil || *e.Conditions.Ready {
				ready++
			}
		}
	}
	if ready == 0 {
		return false, subject + " has no ready endpoint"
	}
	return true, fmt.Sprintf("%s, %d ready endpoint(s)", subject, ready)
}

// checkBackendWebhook proves the validating webhook answers: a valid
// CacheBackend is accepted and one that only the webhook's rules reject
// (the schema admits it) is rejected by it, both with a server-side dry run.
func checkBackendWebhook(ctx context.Context, c client.Client, ns string) CheckResult {
	r := CheckResult{Name: "CacheBackend webhook answers (dry run)"}
	valid := &v1alpha1.CacheBackend{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "inferencecache-check-"},
		Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeLMCache, Runtime: v1alpha1.RuntimeVLLM,
			EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"inferencecache.io/check": "true"}}},
	}
	if err := c.Create(ctx, valid, client.DryRunAll); err != nil {
		r.Detail = fmt.Sprintf("a valid CacheBackend is refused: %v", err)
		return r
	}
	invalid := valid.DeepCopy()
	invalid.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{Args: []string{inject.KVTransferConfigFlag + "={}"}}
	err := c.Create(ctx, invalid, client.DryRunAll)
	switch {
	case err == nil:
		r.Detail = "an invalid CacheBackend (engineOverrides setting " + inject.KVTransferConfigFlag + ") was accepted: the webhook is not called"
	case !strings.Contains(err.Error(), BackendWebhookName):
		r.Detail = fmt.Sprintf("an invalid CacheBackend was refused, but not by %s: %v", BackendWebhookName, err)
	default:
		r.OK, r.Detail = true, "valid accepted, invalid rejected by "+BackendWebhookName
	}
	return r
}

// checkPodWebhook proves the Pod webhook answers with a server-side dry run
// of a pod in ns. The pod carries a stale receipt, which the webhook strips
// from every pod it sees (failurePolicy Ignore would admit it unchanged
// when the webhook is down); it has the labels of a CacheBackend of ns
// that can wire it, if there is one, and must then come back wired by it.
func checkPodWebhook(ctx context.Context, c client.Client, ns string) CheckResult {
	r := CheckResult{Name: "Pod webhook answers (dry run)"}
	var list v1alpha1.CacheBackendList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil && !meta.IsNoMatchError(err) {
		r.Detail = fmt.Sprintf("listing CacheBackends in %s: %v", ns, err)
		return r
	}
	var target *v1alpha1.CacheBackend
	for i := range list.Items {
		cb := &list.Items[i]
		if len(cb.Spec.EngineSelector.MatchLabels) > 0 && (cb.Spec.Type != v1alpha1.BackendTypeLMCache || cb.Status.Endpoint != "") {
			target = v1alpha1.Claimant(cb.Spec.EngineSelector.MatchLabels, list.Items)
			break
		}
	}
	stale := ns + "/inferencecache-check-stale-receipt"
	container := "engine"
	labels := map[string]string{"inferencecache.io/check": "true"}
	if target != nil {
		labels = target.Spec.EngineSelector.MatchLabels
		if n := target.Spec.Integration.EngineContainer; n != "" {
			container = n
		}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "inferencecache-check-", Labels: labels,
			Annotations: map[string]string{v1alpha1.AnnotationInjectedBy: stale}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: container, Image: "vllm/vllm-openai", Args: []string{"--model", "check"}}}},
	}
	if err := c.Create(ctx, pod, client.DryRunAll); err != nil {
		r.Detail = fmt.Sprintf("dry-run create of a pod in %s: %v", ns, err)
		return r
	}
	got := pod.Annotations[v1alpha1.AnnotationInjectedBy]
	switch {
	case got == stale:
		r.Detail = fmt.Sprintf("the pod came back unchanged: the webhook was not called for namespace %s, or did not answer", ns)
	case target == nil:
		r.OK, r.Detail = true, fmt.Sprintf("the webhook stripped a stale receipt (no CacheBackend in %s can wire a pod)", ns)
	case got == target.Namespace+"/"+target.Name:
		r.OK, r.Detail = true, fmt.Sprintf("a pod matching CacheBackend %s came back wired by it", target.Name)
	case pod.Annotations[v1alpha1.AnnotationInjectSkipped] != "":
		r.OK, r.Detail = true, fmt.Sprintf("a pod matching CacheBackend %s came back skipped (%s)", target.Name, pod.Annotations[v1alpha1.AnnotationInjectSkipped])
	default:
		r.OK, r.Detail = true, fmt.Sprintf("the webhook answered; a pod matching CacheBackend %s was admitted unwired (fail-open)", target.Name)
	}
	return r
}
