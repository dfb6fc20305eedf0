package podmutation

import (
	"github.com/inferencecache/operator/internal/inject/injecttest"
)

// The shared fixtures, under the names these tests use.
var (
	backend       = injecttest.Backend
	enginePod     = injecttest.EnginePod
	forgedReceipt = injecttest.ForgedReceipt
)
