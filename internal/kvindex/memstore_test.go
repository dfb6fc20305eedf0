package kvindex_test

import (
	"testing"

	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/storetest"
)

func TestMemStore(t *testing.T) {
	storetest.Run(t, func(*testing.T) kvindex.Store { return kvindex.NewMemStore() })
}
