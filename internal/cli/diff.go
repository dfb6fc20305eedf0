package cli

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/pmezard/go-difflib/difflib"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/apply"
	"github.com/inferencecache/operator/internal/render"
)

// Diff shows what a reconcile of cb (as written in a file) would change in
// the cluster: each rendered child is applied with a server-side dry run
// under the operator's field manager, and the result is compared with the
// live object. It writes nothing. It reports whether anything would change.
func Diff(ctx context.Context, c client.Client, cb *v1alpha1.CacheBackend) (string, bool, error) {
	live := &v1alpha1.CacheBackend{}
	switch err := c.Get(ctx, client.ObjectKeyFromObject(cb), live); {
	case apierrors.IsNotFound(err):
		return fmt.Sprintf("CacheBackend %s/%s is not in the cluster: applying it creates all of its children (see render)\n", cb.Namespace, cb.Name), true, nil
	case err != nil:
		return "", false, err
	}
	b := cb.DeepCopy()
	b.UID = live.UID // owner references name the live object
	objs, err := apply.Objects(render.Render(b))
	if err != nil {
		return "", false, err
	}
	var out strings.Builder
	changed := false
	for _, want := range objs {
		cur := &unstructured.Unstructured{}
		cur.SetGroupVersionKind(want.GroupVersionKind())
		getErr := c.Get(ctx, client.ObjectKeyFromObject(want), cur)
		if getErr != nil && !apierrors.IsNotFound(getErr) {
			return "", false, getErr
		}
		dry := want.DeepCopy()
		if err := c.Patch(ctx, dry, client.Apply, client.DryRunAll, client.ForceOwnership, client.FieldOwner(apply.FieldManager)); err != nil {
			return "", false, fmt.Errorf("server-side dry run of %s %s: %w", want.GetKind(), want.GetName(), err)
		}
		subject := fmt.Sprintf("%s %s/%s", want.GetKind(), want.GetNamespace(), want.GetName())
		if apierrors.IsNotFound(getErr) {
			changed = true
			fmt.Fprintf(&out, "%s would be created\n", subject)
			continue
		}
		d, err := yamlDiff(subject, clean(cur), clean(dry))
		if err != nil {
			return "", false, err
		}
		if d != "" {
			changed = true
			out.WriteString(d)
		}
	}
	pruned, err := prunable(ctx, c, b, objs)
	if err != nil {
		return "", false, err
	}
	for _, p := range pruned {
		changed = true
		fmt.Fprintf(&out, "%s would be deleted (no longer wanted)\n", p)
	}
	if !changed {
		out.WriteString("no changes\n")
	}
	return out.String(), changed, nil
}

// clean removes what the API server sets on every write.
func clean(u *unstructured.Unstructured) map[string]any {
	o := u.DeepCopy().Object
	for _, f := range []string{"managedFields", "resourceVersion", "generation", "creationTimestamp", "uid"} {
		unstructured.RemoveNestedField(o, "metadata", f)
	}
	delete(o, "status")
	return o
}

func yamlDiff(subject string, a, b map[string]any) (string, error) {
	ay, err := yaml.Marshal(a)
	if err != nil {
		return "", err
	}
	by, err := yaml.Marshal(b)
	if err != nil {
		return "", err
	}
	if string(ay) == string(by) {
		return "", nil
	}
	return difflib.GetUnifiedDiffString(difflib.UnifiedDiff{
		A: difflib.SplitLines(string(ay)), B: difflib.SplitLines(string(by)),
		FromFile: subject + " (live)", ToFile: subject + " (after reconcile)", Context: 3,
	})
}

// prunable lists the owned children of kinds the controller prunes that the
// rendered set no longer holds.
func prunable(ctx context.Context, c client.Client, cb *v1alpha1.CacheBackend, want []*unstructured.Unstructured) ([]string, error) {
	wanted := map[string]bool{}
	for _, w := range want {
		wanted[w.GetKind()+"/"+w.GetName()] = true
	}
	var out []string
	for _, kind := range []struct{ apiVersion, kind string }{
		{"apps/v1", "Deployment"}, {"apps/v1", "StatefulSet"}, {"v1", "Service"}, {"autoscaling/v2", "HorizontalPodAutoscaler"},
	} {
		list := &unstructured.UnstructuredList{}
		list.SetAPIVersion(kind.apiVersion)
		list.SetKind(kind.kind + "List")
		if err := c.List(ctx, list, client.InNamespace(cb.Namespace), client.MatchingLabels{render.LabelCacheBackend: cb.Name}); err != nil {
			return nil, err
		}
		for _, item := range list.Items {
			owned := false
			for _, ref := range item.GetOwnerReferences() {
				if ref.UID == cb.UID && ref.Controller != nil && *ref.Controller {
					owned = true
				}
			}
			if owned && !wanted[kind.kind+"/"+item.GetName()] {
				out = append(out, fmt.Sprintf("%s %s/%s", kind.kind, item.GetNamespace(), item.GetName()))
			}
		}
	}
	sort.Strings(out)
	return out, nil
}
