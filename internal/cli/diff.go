package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/apply"
	"github.com/inferencecache/operator/internal/plan"
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/internal/rollout"
)

// DiffResult is what a reconcile of a CacheBackend, as written in a file,
// would change in the cluster.
type DiffResult struct {
	// Backend is <namespace>/<name>.
	Backend string
	// Missing is true when the CacheBackend is not in the cluster: applying
	// it creates all of its children.
	Missing bool
	// Preview lists each child and what a reconcile would do to it.
	Preview apply.Preview
	// Rolls are the engine rolls a reconcile would make now (the restart
	// cascade, the heal), the controller's own roll plan; RollsNote says
	// why they could not be previewed, "" when they were.
	Rolls     rollout.RollPlan
	RollsNote string
}

// HasChanges reports whether a reconcile would create, change or delete
// anything. A held child (a StatefulSet whose storage cannot change) is
// not a change: the reconcile leaves it alone and reports it.
func (d DiffResult) HasChanges() bool {
	return d.Missing || d.Preview.HasChanges() || len(d.Rolls.Rolls) > 0 || len(d.Rolls.Evictions) > 0
}

// String renders the result for a person: one line per child that would
// change or is held, the changed fields indented below it, or "no changes".
func (d DiffResult) String() string {
	if d.Missing {
		return fmt.Sprintf("CacheBackend %s is not in the cluster: applying it creates all of its children (see render)\n", d.Backend)
	}
	var out strings.Builder
	for _, e := range d.Preview.Entries {
		switch e.Action {
		case apply.Created:
			fmt.Fprintf(&out, "%s would be created\n", e.Subject)
		case apply.Configured:
			fmt.Fprintf(&out, "%s would be changed:\n", e.Subject)
			for _, c := range e.Changes {
				fmt.Fprintf(&out, "  %s\n", c)
			}
		case apply.Deleted:
			fmt.Fprintf(&out, "%s would be deleted (no longer wanted)\n", e.Subject)
		case apply.Held:
			fmt.Fprintf(&out, "%s is held, left as it is: %s\n", e.Subject, e.Reason)
		}
	}
	for _, r := range d.Rolls.Rolls {
		fmt.Fprintf(&out, "%s/%s would be rolled (pod template annotation %s=%s): %s\n",
			r.Workload.Kind, d.namespace()+"/"+r.Workload.Name, v1alpha1.AnnotationServerInstance, r.Value, rollCause(r.Cause))
	}
	for _, e := range d.Rolls.Evictions {
		fmt.Fprintf(&out, "Pod/%s on node %s would be evicted: the node-local cache server of its node was replaced or restarted, and it is wired to it\n",
			d.namespace()+"/"+e.Pod, e.Node)
	}
	if len(d.Rolls.Rolls) == 0 && len(d.Rolls.Evictions) == 0 && d.Rolls.Wait > 0 {
		out.WriteString("engine rolls wait for the endpoint to settle: a reconcile rolls them shortly\n")
	}
	if d.RollsNote != "" {
		fmt.Fprintf(&out, "engine rolls not previewed: %s\n", d.RollsNote)
	}
	if !d.HasChanges() {
		out.WriteString("no changes\n")
	}
	return out.String()
}

// namespace is the backend's namespace.
func (d DiffResult) namespace() string {
	ns, _, _ := strings.Cut(d.Backend, "/")
	return ns
}

// Diff shows what a reconcile of cb (as written in a file) would change in
// the cluster. It builds the controller's own plan (plan.Gather and
// plan.Build: the same holds, hand-offs and prunes) and previews it with
// the applier's server-side dry run (fluxcd/pkg/ssa), and the engine rolls
// a reconcile would make now (rollout.Rolls; keys verify the engines'
// receipts, nil when they could not be read). It writes nothing.
func Diff(ctx context.Context, c client.Client, cb *v1alpha1.CacheBackend, keys []receipt.Key) (DiffResult, error) {
	res := DiffResult{Backend: cb.Namespace + "/" + cb.Name}
	live := &v1alpha1.CacheBackend{}
	switch err := c.Get(ctx, client.ObjectKeyFromObject(cb), live); {
	case apierrors.IsNotFound(err):
		res.Missing = true
		return res, nil
	case err != nil:
		return res, fmt.Errorf("reading CacheBackend %s: %w", res.Backend, err)
	}
	b := cb.DeepCopy()
	b.UID = live.UID // owner references name the live object
	in, err := plan.Gather(ctx, c, c, b)
	if err != nil {
		return res, err
	}
	p, err := plan.Build(in)
	if err != nil {
		return res, err
	}
	if msg := p.ConflictMessage(); msg != "" {
		return res, fmt.Errorf("a reconcile would apply nothing (NameConflict): %s", msg)
	}
	if res.Preview, err = apply.New(c).Preview(ctx, p); err != nil {
		return res, err
	}
	rolls, err := PreviewRolls(ctx, c, live, p.WorkloadHold() != nil, keys, time.Now())
	if err != nil {
		res.RollsNote = err.Error()
	}
	res.Rolls = rolls
	return res, nil
}
