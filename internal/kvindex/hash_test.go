package kvindex

import (
	"errors"
	"testing"
)

// The worked values of the KV-events note (verified there against cbor2 and
// vLLM): seed "vllm-none-hash", block size 4, tokens 1..8.
func TestHashTokensMatchesVLLMSha256CBOR(t *testing.T) {
	tests := []struct {
		name   string
		tokens []uint32
		want   []uint64
	}{
		{"two blocks", []uint32{1, 2, 3, 4, 5, 6, 7, 8}, []uint64{0x84b146b151d55111, 0xd43b57df56b58fb1}},
		{"partial block ignored", []uint32{1, 2, 3, 4, 5, 6}, []uint64{0x84b146b151d55111}},
		{"no full block", []uint32{1, 2}, []uint64{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := HashTokens("sha256_cbor", "vllm-none-hash", 4, tt.tokens)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %d hashes %x, want %x", len(got), got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("hash %d = %#x, want %#x", i, got[i], tt.want[i])
				}
			}
		})
	}
}

func TestHashTokensRefusesIrreproducibleSchemes(t *testing.T) {
	for _, alg := range []string{"sha256", "xxhash", ""} {
		if _, err := HashTokens(alg, "vllm-none-hash", 16, make([]uint32, 32)); !errors.Is(err, ErrTokensUnsupported) {
			t.Errorf("%q: err = %v, want ErrTokensUnsupported", alg, err)
		}
	}
	if _, err := HashTokens("sha256_cbor", "", 16, make([]uint32, 32)); !errors.Is(err, ErrTokensUnsupported) {
		t.Errorf("no seed: err = %v, want ErrTokensUnsupported", err)
	}
}

// LMCache 0.5.6's own TokenHasher(chunk_size=4, hash_algorithm="blake3") on
// tokens 1..9, low 64 bits (printed by the locked environment's lmcache).
func TestHashChunksMatchesLMCacheBlake3(t *testing.T) {
	got, err := HashPrompt("lmcache_blake3", "", 4, []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9})
	if err != nil {
		t.Fatal(err)
	}
	if want := []uint64{0x231f41368b71123c, 0xbb8cdbd83a8c0e19}; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("chunk hashes %#x, want %#x", got, want)
	}
	if _, err := HashPrompt("lmcache_blake3", "", 0, make([]uint32, 8)); !errors.Is(err, ErrTokensUnsupported) {
		t.Fatalf("chunk size 0: err = %v, want ErrTokensUnsupported", err)
	}
}

// SGLang 0.5.23's own get_hash_str(tokens, None, 16) through
// hash_str_to_int64 (printed by the locked environment's sglang) on
// tokens 1..32, as unsigned; the engine publishes the same values in its
// BlockStored events (test/kvevents checks the pages end to end).
func TestHashPagesMatchesSGLang(t *testing.T) {
	toks := make([]uint32, 36)
	for i := range toks {
		toks[i] = uint32(i + 1)
	}
	got, err := HashPrompt("sglang_sha256", "", 16, toks)
	if err != nil {
		t.Fatal(err)
	}
	// The partial third page is not hashed: only whole pages are stored.
	if want := []uint64{8635429971592222890, 1256577331724852459}; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("page hashes %d, want %d", got, want)
	}
	if _, err := HashPrompt("sglang_sha256", "", 0, toks); !errors.Is(err, ErrTokensUnsupported) {
		t.Fatalf("page size 0: err = %v, want ErrTokensUnsupported", err)
	}
}
