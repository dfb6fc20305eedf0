package cli

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/internal/imageref"
)

// Unknown is what version says for a value it cannot find.
const Unknown = "unknown"

// ManagerVersion is what the running manager's Deployment says of its
// version.
type ManagerVersion struct {
	// Image is the manager container's image reference.
	Image string `json:"image"`
	// Tag is the image's tag (or digest when pinned by digest only).
	Tag string `json:"tag"`
	// Label is the Deployment's app.kubernetes.io/version label.
	Label string `json:"label"`
}

// ReadManagerVersion reads the manager Deployment in ns. Values it cannot
// find are Unknown; a missing Deployment is an error.
func ReadManagerVersion(ctx context.Context, c client.Reader, ns string) (ManagerVersion, error) {
	d := &appsv1.Deployment{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: ManagerDeployment}, d); err != nil {
		if apierrors.IsNotFound(err) {
			return ManagerVersion{}, fmt.Errorf("no manager Deployment %s/%s: %w", ns, ManagerDeployment, err)
		}
		return ManagerVersion{}, fmt.Errorf("reading the manager Deployment %s/%s: %w", ns, ManagerDeployment, err)
	}
	v := ManagerVersion{Image: Unknown, Tag: Unknown, Label: Unknown}
	if l := d.Labels[LabelVersion]; l != "" {
		v.Label = l
	}
	for i, c := range d.Spec.Template.Spec.Containers {
		if c.Name == ManagerContainer || (i == 0 && v.Image == Unknown) {
			v.Image = c.Image
		}
	}
	if v.Image != Unknown {
		v.Tag = ImageTag(v.Image)
	}
	return v, nil
}

// ImageTag returns the tag of an image reference, its digest when it has no
// tag, and Unknown when it has neither (an implicit "latest" is not a
// version).
func ImageTag(ref string) string {
	_, tag, digest := imageref.Split(ref)
	switch {
	case tag != "":
		return tag
	case digest != "":
		return digest
	}
	return Unknown
}
