package kvindex

import "fmt"

// Bounds on every name a caller sends, on read and ingest paths alike, in
// bytes. A name is a key of the index's state (a backend, a pod, a block
// space) or is compared with one, so none may be larger than what it
// names can be: Kubernetes bounds namespaces to 63 (a DNS label), pod
// names to 253 (a DNS subdomain), and the CRD CacheBackend names to 63.
// Model and LoRA names are the engine's served names (a Hugging Face ID
// "org/name" is at most 96+1+96), the hash scheme's seed is the engine's
// PYTHONHASHSEED-like text.
const (
	MaxNamespaceBytes     = 63
	MaxBackendNameBytes   = 63
	MaxPodNameBytes       = 253
	MaxPodUIDBytes        = 64
	MaxModelBytes         = 256
	MaxLoraBytes          = 256
	MaxEngineBytes        = 64
	MaxHashAlgorithmBytes = 64
	MaxHashSeedBytes      = 256
	// MaxWorkerAddressBytes bounds a Hello's worker_address (a URL such
	// as "http://[IPv6]:port").
	MaxWorkerAddressBytes = 256
	// MaxCandidatePods bounds a Score's candidate_pods (each compared with
	// every match).
	MaxCandidatePods = 1024
)

// Bounds on one query's prompt: the index hashes token IDs into block
// keys (one SHA-256 a block per hash scheme of the backend's pods) and
// looks block hashes up, so a prompt's size is the query's cost. 262,144
// tokens are twice the 128k context of today's common long-context
// models; 65,536 block hashes are a million tokens at 16 a block.
const (
	MaxQueryTokens = 262_144
	MaxQueryHashes = 65_536
)

// checkPrompt bounds a query's token IDs and block hashes.
func checkPrompt(hashes []uint64, tokens []uint32) error {
	if n := len(tokens); n > MaxQueryTokens {
		return fmt.Errorf("token_ids has %d tokens, over the index's bound of %d: %w", n, MaxQueryTokens, ErrInvalid)
	}
	if n := len(hashes); n > MaxQueryHashes {
		return fmt.Errorf("block_hashes has %d hashes, over the index's bound of %d: %w", n, MaxQueryHashes, ErrInvalid)
	}
	return nil
}

// checkLen refuses a value of field longer than max bytes: InvalidArgument
// (HTTP 400) naming the field.
func checkLen(field, value string, max int) error {
	if len(value) > max {
		return fmt.Errorf("%s is %d bytes, over the index's bound of %d: %w", field, len(value), max, ErrInvalid)
	}
	return nil
}

// checkBackend bounds a CacheBackend reference's fields.
func checkBackend(b BackendRef) error {
	if err := checkLen("cache_backend.namespace", b.Namespace, MaxNamespaceBytes); err != nil {
		return err
	}
	return checkLen("cache_backend.name", b.Name, MaxBackendNameBytes)
}
