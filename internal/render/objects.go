package render

import (
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Objects converts children into the unstructured objects that are
// applied, in a stable order (claim, Service, workload, HPA). The
// controller applies them and the CLI prints them, so a preview is exactly
// what is applied.
func Objects(c Children) ([]*unstructured.Unstructured, error) {
	var acs []any
	if c.PVC != nil {
		acs = append(acs, c.PVC)
	}
	if c.Service != nil {
		acs = append(acs, c.Service)
	}
	if c.Deployment != nil {
		acs = append(acs, c.Deployment)
	}
	if c.StatefulSet != nil {
		acs = append(acs, c.StatefulSet)
	}
	if c.DaemonSet != nil {
		acs = append(acs, c.DaemonSet)
	}
	if c.HPA != nil {
		acs = append(acs, c.HPA)
	}
	objs := make([]*unstructured.Unstructured, 0, len(acs))
	for _, ac := range acs {
		raw, err := json.Marshal(ac)
		if err != nil {
			return nil, fmt.Errorf("encoding apply configuration: %w", err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(raw); err != nil {
			return nil, fmt.Errorf("decoding apply configuration: %w", err)
		}
		objs = append(objs, u)
	}
	return objs, nil
}
