package metrics

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		method, url, contentType string
		verb, resource           string
	}{
		{"GET", "/api/v1/namespaces/llm/pods", "", "list", "pods"},
		{"GET", "/api/v1/pods?watch=true&labelSelector=a", "", "watch", "pods"},
		{"GET", "/api/v1/namespaces/llm/pods/engine-0", "", "get", "pods"},
		{"PATCH", "/apis/apps/v1/namespaces/llm/deployments/cache?fieldManager=x&dryRun=All", "application/apply-patch+yaml", "dryrun-apply", "deployments"},
		{"PATCH", "/apis/inferencecache.io/v1alpha1/namespaces/llm/cachebackends/cache/status", "application/apply-patch+yaml", "apply", "cachebackends/status"},
		{"PATCH", "/api/v1/namespaces/llm/pods/engine-0", "application/merge-patch+json", "patch", "pods"},
		{"POST", "/apis/events.k8s.io/v1/namespaces/llm/events", "", "create", "events"},
		{"PUT", "/apis/coordination.k8s.io/v1/namespaces/x/leases/l", "", "update", "leases"},
		{"DELETE", "/api/v1/namespaces/llm/services/cache", "", "delete", "services"},
		{"GET", "/api/v1/namespaces", "", "list", "namespaces"},
		{"GET", "/version", "", "get", "other"},
	} {
		r, err := http.NewRequest(c.method, "https://api"+c.url, nil)
		assert.NoError(t, err)
		if c.contentType != "" {
			r.Header.Set("Content-Type", c.contentType)
		}
		verb, resource := Classify(r)
		assert.Equal(t, c.verb+" "+c.resource, verb+" "+resource, "%s %s", c.method, c.url)
	}
}
