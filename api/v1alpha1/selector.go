package v1alpha1

// The selector's rule, in one place: the webhook, the controller, the
// evaluation of engine pods and the CLI all ask these.

// Matches reports whether a pod with these labels is selected: every
// key/value of matchLabels is among them, as a Service selector reads. An
// empty selector matches nothing (admission refuses one; an object written
// around admission selects no pod rather than every pod).
func (s EngineSelector) Matches(podLabels map[string]string) bool {
	if len(s.MatchLabels) == 0 {
		return false
	}
	for k, v := range s.MatchLabels {
		if have, ok := podLabels[k]; !ok || have != v {
			return false
		}
	}
	return true
}

// Selects reports whether cb, not being deleted, selects a pod with these
// labels.
func (cb *CacheBackend) Selects(podLabels map[string]string) bool {
	return cb.DeletionTimestamp.IsZero() && cb.Spec.EngineSelector.Matches(podLabels)
}

// Claimant returns the CacheBackend that claims a pod with these labels:
// of backends (one namespace's) that select it, the first by
// metadata.name. Nil when none does.
func Claimant(podLabels map[string]string, backends []CacheBackend) *CacheBackend {
	var first *CacheBackend
	for i := range backends {
		if cb := &backends[i]; cb.Selects(podLabels) && (first == nil || cb.Name < first.Name) {
			first = cb
		}
	}
	return first
}
