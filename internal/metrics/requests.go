package metrics

import (
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// APIRequests counts the requests the operator sends to the API server, by
// verb (get, list, watch, create, update, patch, apply, delete, with a
// dryrun- prefix for server-side dry runs) and resource (with its
// subresource, e.g. pods/status). The API server's own
// apiserver_request_total says the same per user, where it can be scraped;
// this counter is the operator's view, scraped from its own endpoint.
var APIRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "inferencecache_apiserver_requests_total",
	Help: "Requests the operator sent to the API server, by verb and resource.",
}, []string{"verb", "resource"})

func init() { ctrlmetrics.Registry.MustRegister(APIRequests) }

// CountRequests returns a copy of cfg whose requests are counted in
// APIRequests.
func CountRequests(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	wrap := cfg.WrapTransport
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		if wrap != nil {
			rt = wrap(rt)
		}
		return counting{rt}
	}
	return cfg
}

type counting struct{ next http.RoundTripper }

func (c counting) RoundTrip(r *http.Request) (*http.Response, error) {
	verb, resource := Classify(r)
	APIRequests.WithLabelValues(verb, resource).Inc()
	return c.next.RoundTrip(r)
}

// Classify names a request to the API server by verb and resource, as
// APIRequests counts it.
func Classify(r *http.Request) (verb, resource string) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return strings.ToLower(r.Method), "other"
	}
	if len(parts) >= 2 && parts[0] == "namespaces" && len(parts) > 2 {
		parts = parts[2:]
	}
	named := len(parts) >= 2
	resource = "other"
	if len(parts) > 0 {
		resource = parts[0]
	}
	if len(parts) >= 3 {
		resource += "/" + parts[2]
	}
	q := r.URL.Query()
	switch r.Method {
	case http.MethodGet:
		switch {
		case q.Get("watch") == "true" || q.Get("watch") == "1":
			verb = "watch"
		case named:
			verb = "get"
		default:
			verb = "list"
		}
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
		if r.Header.Get("Content-Type") == "application/apply-patch+yaml" || strings.HasPrefix(r.Header.Get("Content-Type"), "application/apply-patch") {
			verb = "apply"
		}
	case http.MethodDelete:
		verb = "delete"
	default:
		verb = strings.ToLower(r.Method)
	}
	if q.Get("dryRun") != "" {
		verb = "dryrun-" + verb
	}
	return verb, resource
}
