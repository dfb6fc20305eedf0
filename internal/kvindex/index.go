package kvindex

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
)

// ProtocolVersion is the contract version this index speaks.
const ProtocolVersion = 1

// ErrInvalid marks a malformed request (InvalidArgument / 400).
var ErrInvalid = errors.New("invalid request")

// Options configure an Index.
type Options struct {
	Store         Store
	Authenticator Authenticator
	Policy        Policy
	// Lease: a pod whose subscriber sends nothing for this long loses its
	// blocks. Default 60s.
	Lease time.Duration
	// Heartbeat the subscribers are asked to keep when idle. Default 10s.
	Heartbeat time.Duration
	// StaleAfter: a pod silent for this long is reported Stale. Default 3 ×
	// Heartbeat.
	StaleAfter time.Duration
	// MaxSnapshotBlocks bounds one rank's snapshot, and the snapshots one
	// stream stages at once, all ranks together. Default
	// DefaultMaxSnapshotBlocks.
	MaxSnapshotBlocks int
	// MaxStagedBlocks bounds the snapshot entries every stream together
	// stages before their ends (16 bytes each): a chunk past it ends its
	// snapshot with a ScopeStaging *LimitError (ResourceExhausted at the
	// end; the subscriber reconnects after its backoff). Default
	// DefaultMaxStagedBlocks.
	MaxStagedBlocks int
	// MaxStagedBlocksPerNamespace bounds what the streams of one namespace
	// stage together, so that no namespace takes the whole staging budget
	// from the others (issue 35): a chunk past it ends its snapshot with a
	// ScopeNamespaceStaging *LimitError. Default (and at most)
	// MaxStagedBlocks/2: one whole snapshot of the largest size under the
	// defaults.
	MaxStagedBlocksPerNamespace int
	// Limits are the block limits the Store was made with. The Store
	// enforces them; the session uses PodBlocks only to stop staging a
	// snapshot that cannot fit (more than NumTiers-1 entries per block
	// the pod may hold) before it takes that memory.
	Limits Limits
	// MaxRanks bounds a Hello's data_parallel_size. Default
	// DefaultMaxRanks.
	MaxRanks uint32
	// Backends, when set, is asked on every Hello whether its CacheBackend
	// exists; a Hello for one that does not is refused. Nil accepts any
	// name (--require-backend=false).
	Backends Backends
	// Observer hears ingest and query events. Default NopObserver.
	Observer Observer
	Log      logr.Logger
	Now      func() time.Time
}

// DefaultMaxSnapshotBlocks is Options.MaxSnapshotBlocks when unset.
const DefaultMaxSnapshotBlocks = 4_000_000

// DefaultMaxStagedBlocks is Options.MaxStagedBlocks when unset
// (cache-index --max-staged-blocks): two whole snapshots of the largest
// size, 128 MB of entries.
const DefaultMaxStagedBlocks = 2 * DefaultMaxSnapshotBlocks

// DefaultMaxRanks is Options.MaxRanks when unset (cache-index
// --max-ranks): a pod's data-parallel ranks are its engine's local ones,
// one per GPU (8 on the nodes vLLM and SGLang document, 16 on the largest),
// so 64 leaves room fourfold while bounding what one Hello may stage.
const DefaultMaxRanks = 64

// Backends tells whether a CacheBackend exists. Implementations answer from
// a cache (server.BackendInformer), so that a flood of Hellos for junk
// names costs the API server nothing.
type Backends interface {
	Exists(ctx context.Context, b BackendRef) (bool, error)
}

// Index is the index service: ingest sessions, lease expiry, Score and
// Participation, over a Store.
type Index struct {
	opt Options

	staged atomic.Int64 // snapshot entries staged by every session

	stagedMu sync.Mutex
	nsStaged map[string]int64 // snapshot entries staged per namespace; no zero entries

	mu       sync.Mutex
	sessions map[PodKey]*Session
	rates    map[BackendRef]*rateWindow
}

// New returns an Index.
func New(opt Options) *Index {
	if opt.Lease <= 0 {
		opt.Lease = time.Minute
	}
	if opt.Heartbeat <= 0 {
		opt.Heartbeat = 10 * time.Second
	}
	if opt.StaleAfter <= 0 {
		opt.StaleAfter = 3 * opt.Heartbeat
	}
	if opt.MaxSnapshotBlocks <= 0 {
		opt.MaxSnapshotBlocks = DefaultMaxSnapshotBlocks
	}
	if opt.MaxStagedBlocks <= 0 {
		opt.MaxStagedBlocks = DefaultMaxStagedBlocks
	}
	if opt.MaxStagedBlocksPerNamespace <= 0 || opt.MaxStagedBlocksPerNamespace > opt.MaxStagedBlocks {
		opt.MaxStagedBlocksPerNamespace = max(opt.MaxStagedBlocks/2, 1)
	}
	if opt.MaxRanks == 0 {
		opt.MaxRanks = DefaultMaxRanks
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.Authenticator == nil {
		opt.Authenticator = AllowAll{}
	}
	if opt.Observer == nil {
		opt.Observer = NopObserver{}
	}
	return &Index{opt: opt, sessions: map[PodKey]*Session{}, rates: map[BackendRef]*rateWindow{}, nsStaged: map[string]int64{}}
}

// Authenticate checks a bearer token for a call of api (ingest, query)
// and reports a refusal to the Observer.
func (ix *Index) Authenticate(ctx context.Context, api, token string) (Caller, error) {
	c, err := ix.opt.Authenticator.Authenticate(ctx, token)
	if err != nil {
		ix.opt.Observer.Refused(api)
	}
	return c, err
}

// Log is the index's logger; the transports log with it.
func (ix *Index) Log() logr.Logger { return ix.opt.Log }

// ExpireLeases removes the pods whose lease ended; cmd/cache-index calls it
// periodically. Every replica on a shared store may call it: a pod is
// removed once.
func (ix *Index) ExpireLeases(ctx context.Context) (int, error) {
	gone, err := ix.opt.Store.ExpireLeases(ctx, ix.opt.Now())
	for _, p := range gone {
		ix.opt.Log.Info("pod lease expired; its blocks were removed", "cacheBackend", p.Backend.String(), "podUID", p.UID)
		ix.dropRateIfEmpty(ctx, p.Backend)
	}
	return len(gone), err
}

// RunLeaseReaper calls ExpireLeases every interval until ctx ends.
func (ix *Index) RunLeaseReaper(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := ix.ExpireLeases(ctx); err != nil {
				ix.opt.Log.Error(err, "expiring leases")
			}
		}
	}
}

// dropRateIfEmpty forgets the ingest rate window of a backend whose last
// pod was reaped, so that windows do not outlive every lease.
func (ix *Index) dropRateIfEmpty(ctx context.Context, b BackendRef) {
	pods, err := ix.opt.Store.Pods(ctx, b)
	if err != nil || len(pods) > 0 {
		return
	}
	ix.mu.Lock()
	delete(ix.rates, b)
	ix.mu.Unlock()
}

// reserveStaging counts adding snapshot entries of namespace ns in the
// staging budgets, or returns the *LimitError of the one it would pass:
// the index's (ScopeStaging) or the namespace's share
// (ScopeNamespaceStaging).
func (ix *Index) reserveStaging(ns string, adding uint64) error {
	ix.stagedMu.Lock()
	defer ix.stagedMu.Unlock()
	if held := ix.staged.Add(int64(adding)); held > int64(ix.opt.MaxStagedBlocks) {
		ix.staged.Add(-int64(adding))
		return &LimitError{Scope: ScopeStaging, Limit: uint64(ix.opt.MaxStagedBlocks), Held: uint64(held) - adding, Adding: adding}
	}
	if held := ix.nsStaged[ns]; held+int64(adding) > int64(ix.opt.MaxStagedBlocksPerNamespace) {
		ix.staged.Add(-int64(adding))
		return &LimitError{Scope: ScopeNamespaceStaging, Limit: uint64(ix.opt.MaxStagedBlocksPerNamespace), Held: uint64(held), Adding: adding}
	}
	ix.nsStaged[ns] += int64(adding)
	return nil
}

// releaseStaging gives back n entries of namespace ns.
func (ix *Index) releaseStaging(ns string, n int64) {
	if n == 0 {
		return
	}
	ix.stagedMu.Lock()
	defer ix.stagedMu.Unlock()
	ix.staged.Add(-n)
	if ix.nsStaged[ns] -= n; ix.nsStaged[ns] <= 0 {
		delete(ix.nsStaged, ns)
	}
}
