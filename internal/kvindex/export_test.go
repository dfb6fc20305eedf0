package kvindex

// RateWindows is how many backends the index keeps an ingest-rate window
// for.
func RateWindows(ix *Index) int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return len(ix.rates)
}
