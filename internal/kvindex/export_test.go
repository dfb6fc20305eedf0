package kvindex

// RateWindows is how many backends the index keeps an ingest-rate window
// for.
func RateWindows(ix *Index) int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return len(ix.rates)
}

// StagedBlocks is what the index's staging budget counts now.
func StagedBlocks(ix *Index) int64 { return ix.staged.Load() }
