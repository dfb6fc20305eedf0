package apply

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/fluxcd/pkg/ssa"
	ssajsondiff "github.com/fluxcd/pkg/ssa/jsondiff"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/inferencecache/operator/internal/plan"
)

// PreviewEntry is what executing a plan would do to one child.
type PreviewEntry struct {
	// Subject is Kind/namespace/name.
	Subject string
	Action  Action
	// Changes lists the fields a Configured child would change, one line
	// each ("replace /spec/replicas: 2"), from fluxcd/pkg/ssa's jsondiff.
	Changes []string
	// Reason says why a child is held.
	Reason string
}

// Preview is what executing a plan would change. It is computed with the
// applier's own drift rule (fluxcd/pkg/ssa's Diff: a server-side dry run
// under the operator's field manager, compared with the live object), so a
// preview and a reconcile can never disagree about what changes.
type Preview struct {
	Entries []PreviewEntry
}

// HasChanges reports whether executing the plan would write or delete a
// child. Held children are not changes: a reconcile leaves them alone.
func (p Preview) HasChanges() bool {
	return slices.ContainsFunc(p.Entries, func(e PreviewEntry) bool {
		return e.Action == Created || e.Action == Configured || e.Action == Deleted
	})
}

// Holds lists the held entries.
func (p Preview) Holds() []PreviewEntry {
	var out []PreviewEntry
	for _, e := range p.Entries {
		if e.Action == Held {
			out = append(out, e)
		}
	}
	return out
}

// Preview computes what Execute would do with p, writing nothing.
func (a *Applier) Preview(ctx context.Context, p plan.Plan) (Preview, error) {
	var out Preview
	for _, o := range p.Apply {
		obj := o.DeepCopy()
		e, existing, dry, err := a.rm.Diff(ctx, obj, ssa.DefaultDiffOptions())
		if err != nil {
			return out, fmt.Errorf("server-side dry run of %s/%s: %w", o.GetKind(), o.GetName(), err)
		}
		entry := PreviewEntry{Subject: o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName(), Action: action(e.Action)}
		if entry.Action == Configured && existing != nil && dry != nil {
			patch, err := ssajsondiff.DiffUnstructured(existing, dry)
			if err != nil {
				return out, fmt.Errorf("comparing %s: %w", entry.Subject, err)
			}
			for _, op := range patch {
				v, _ := json.Marshal(op.Value)
				entry.Changes = append(entry.Changes, fmt.Sprintf("%s %s: %s", op.Type, op.Path, v))
			}
			for _, m := range []struct {
				field     string
				have, got map[string]string
			}{
				{"labels", existing.GetLabels(), dry.GetLabels()},
				{"annotations", existing.GetAnnotations(), dry.GetAnnotations()},
			} {
				if !equality.Semantic.DeepEqual(m.have, m.got) {
					entry.Changes = append(entry.Changes, fmt.Sprintf("replace /metadata/%s: %v", m.field, m.got))
				}
			}
		}
		out.Entries = append(out.Entries, entry)
	}
	for _, h := range p.Holds {
		out.Entries = append(out.Entries, PreviewEntry{Subject: h.Kind + "/" + p.Backend.Namespace + "/" + h.Name, Action: Held, Reason: h.Reason + ": " + h.Message})
	}
	for _, c := range p.Prune {
		out.Entries = append(out.Entries, PreviewEntry{Subject: c.Subject(), Action: Deleted})
	}
	return out, nil
}
