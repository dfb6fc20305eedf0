package memstore

// SetSparseMax sets the number of matching instances below which the
// memory store's walk switches to its sparse phase, and returns a func
// restoring the previous value (tests force either phase with it).
func SetSparseMax(n int) (restore func()) {
	old := sparseMax
	sparseMax = n
	return func() { sparseMax = old }
}

// Backends is how many backends the store keeps state for.
func Backends(s *Store) int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.backends) + len(s.namespaces)
}

// Spaces is how many block spaces the store keeps, all backends together.
func Spaces(s *Store) int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	n := 0
	for _, b := range s.backends {
		b.mu.RLock()
		n += len(b.spaces)
		b.mu.RUnlock()
	}
	return n
}
