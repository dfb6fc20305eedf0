package hashcheck_test

import (
	"encoding/hex"
	"strings"
	"testing"

	"github.com/inferencecache/operator/internal/kvevent/hashcheck"
	"github.com/inferencecache/operator/internal/kvevent/wire"
)

// The worked values of the kv-events note (section 1.7), checked there
// against cbor2 and msgspec.
func TestNoneHash(t *testing.T) {
	for _, tc := range []struct{ seed, prefix, suffix string }{
		{"vllm-none-hash", "9bd96a48", "9581eef0"},
		{"0", "4e1195df", "e61c3e"}, // PYTHONHASHSEED=0
	} {
		d := hashcheck.NoneHash(tc.seed)
		h := hex.EncodeToString(d[:])
		if !strings.HasPrefix(h, tc.prefix) || !strings.HasSuffix(h, tc.suffix) {
			t.Errorf("NoneHash(%q) = %s, want %s…%s", tc.seed, h, tc.prefix, tc.suffix)
		}
	}
}

// LMCache 0.5.6's own TokenHasher(chunk_size=4, hash_algorithm="blake3")
// on tokens 1..8, as its connector puts them on vLLM's wire (the low 64
// bits): printed by the locked environment's lmcache.
const lm1, lm2 = 0x231f41368b71123c, 0xbb8cdbd83a8c0e19

// TestLMCacheNoneHash: a prompt's first chunk chains from LMCache's
// blake3 NONE_HASH, as its TokenHasher prints it (none_hash.hex()).
func TestLMCacheNoneHash(t *testing.T) {
	none := "7e3eff9ef7613a50340eb12677ee03b83ac759fcba9bb32705f07248d56d473b"
	first, _ := hashcheck.LMCacheDigest(nil, []uint32{1, 2, 3, 4}, nil)
	var p hashcheck.Digest
	if _, err := hex.Decode(p[:], []byte(none)); err != nil {
		t.Fatal(err)
	}
	viaNone, _ := hashcheck.LMCacheDigest(&p, []uint32{1, 2, 3, 4}, nil)
	if first != viaNone || hashcheck.Low64(first) != lm1 {
		t.Fatalf("first chunk %x (low64 %#x), from LMCache's NONE_HASH %x; want equal and %#x", first, hashcheck.Low64(first), viaNone, uint64(lm1))
	}
}

func stored(parent *uint64, tokens []uint32, hashes ...uint64) wire.Event {
	e := wire.Event{Kind: wire.BlockStored, Hashes: hashes, Tokens: tokens, BlockSize: 4}
	if parent != nil {
		e.Parent, e.HasParent = *parent, true
	}
	return e
}

func TestCheck(t *testing.T) {
	const h1, h2 = 0x84b146b151d55111, 0xd43b57df56b58fb1
	p1 := uint64(h1)
	unknown := uint64(42)
	seed0 := hashcheck.NoneHash("0")
	s0b1, _, _ := hashcheck.BlockDigest(seed0, []uint32{1, 2, 3, 4}, nil, nil)
	sg1 := hashcheck.SGLangDigest(nil, []uint32{1, 2, 3, 4})
	sg2 := hashcheck.SGLangDigest(&sg1, []uint32{5, 6, 7, 8})
	pl1 := uint64(lm1)
	for _, tc := range []struct {
		name   string
		scheme hashcheck.Scheme
		events []wire.Event
		want   []hashcheck.Result
		final  hashcheck.Result
	}{
		{"vllm chain from NONE_HASH", hashcheck.Scheme{Algorithm: "sha256_cbor"},
			[]wire.Event{stored(nil, []uint32{1, 2, 3, 4, 5, 6, 7, 8}, h1, h2)}, []hashcheck.Result{hashcheck.Verified}, hashcheck.Verified},
		{"vllm continuation of a verified block", hashcheck.Scheme{Algorithm: "sha256_cbor"},
			[]wire.Event{stored(nil, []uint32{1, 2, 3, 4}, h1), stored(&p1, []uint32{5, 6, 7, 8}, h2)},
			[]hashcheck.Result{hashcheck.Verified, hashcheck.Verified}, hashcheck.Verified},
		{"PYTHONHASHSEED convention", hashcheck.Scheme{Algorithm: "sha256_cbor", Seeds: []string{hashcheck.SeedVLLM, "0"}},
			[]wire.Event{stored(nil, []uint32{1, 2, 3, 4}, hashcheck.Low64(s0b1))}, []hashcheck.Result{hashcheck.Verified}, hashcheck.Verified},
		{"wrong seed", hashcheck.Scheme{Algorithm: "sha256_cbor", Seeds: []string{"0"}},
			[]wire.Event{stored(nil, []uint32{1, 2, 3, 4}, h1)}, []hashcheck.Result{hashcheck.Mismatch}, hashcheck.Mismatch},
		{"wrong block size", hashcheck.Scheme{Algorithm: "sha256_cbor"},
			[]wire.Event{{Kind: wire.BlockStored, Hashes: []uint64{h1}, Tokens: []uint32{1, 2, 3, 4}, BlockSize: 2}},
			[]hashcheck.Result{hashcheck.Unverifiable}, hashcheck.Unverifiable},
		{"tampered hash after a match", hashcheck.Scheme{Algorithm: "sha256_cbor"},
			[]wire.Event{stored(nil, []uint32{1, 2, 3, 4}, h1), stored(nil, []uint32{1, 2, 3, 4}, h1+1)},
			[]hashcheck.Result{hashcheck.Verified, hashcheck.Mismatch}, hashcheck.Mismatch},
		{"no tokens (CPU tier)", hashcheck.Scheme{Algorithm: "sha256_cbor"},
			[]wire.Event{stored(nil, nil, h1)}, []hashcheck.Result{hashcheck.Unverifiable}, hashcheck.Unverifiable},
		{"unknown parent", hashcheck.Scheme{Algorithm: "sha256_cbor"},
			[]wire.Event{stored(&unknown, []uint32{5, 6, 7, 8}, h2)}, []hashcheck.Result{hashcheck.Unverifiable}, hashcheck.Unverifiable},
		{"pickle sha256", hashcheck.Scheme{Algorithm: "sha256"},
			[]wire.Event{stored(nil, []uint32{1, 2, 3, 4}, h1)}, []hashcheck.Result{hashcheck.Unverifiable}, hashcheck.Unverifiable},
		{"sglang chain", hashcheck.Scheme{Algorithm: "sglang_sha256"},
			[]wire.Event{stored(nil, []uint32{1, 2, 3, 4, 5, 6, 7, 8}, hashcheck.SGLangWire(sg1), hashcheck.SGLangWire(sg2))},
			[]hashcheck.Result{hashcheck.Verified}, hashcheck.Verified},
		{"lmcache chunks", hashcheck.Scheme{Algorithm: hashcheck.LMCacheBlake3},
			[]wire.Event{stored(nil, []uint32{1, 2, 3, 4}, lm1), stored(&pl1, []uint32{5, 6, 7, 8}, lm2)},
			[]hashcheck.Result{hashcheck.Verified, hashcheck.Verified}, hashcheck.Verified},
		{"vllm blocks under the lmcache scheme", hashcheck.Scheme{Algorithm: hashcheck.LMCacheBlake3},
			[]wire.Event{stored(nil, []uint32{1, 2, 3, 4}, h1)}, []hashcheck.Result{hashcheck.Mismatch}, hashcheck.Mismatch},
		{"lmcache chunks under the vllm scheme", hashcheck.Scheme{Algorithm: "sha256_cbor"},
			[]wire.Event{stored(nil, []uint32{1, 2, 3, 4}, lm1)}, []hashcheck.Result{hashcheck.Mismatch}, hashcheck.Mismatch},
		{"vllm hashes under the sglang scheme", hashcheck.Scheme{Algorithm: "sglang_sha256"},
			[]wire.Event{stored(nil, []uint32{1, 2, 3, 4}, h1)}, []hashcheck.Result{hashcheck.Mismatch}, hashcheck.Mismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := hashcheck.New(tc.scheme)
			for i := range tc.events {
				if got := c.Check(&tc.events[i]); got != tc.want[i] {
					t.Errorf("event %d: %v, want %v", i, got, tc.want[i])
				}
			}
			if c.Result() != tc.final {
				t.Errorf("result %v, want %v", c.Result(), tc.final)
			}
		})
	}
}

// TestExtraKeysCBOR: extra keys are hashed as canonical CBOR of the
// Python tuple (msgpack arrays become CBOR arrays).
func TestExtraKeysCBOR(t *testing.T) {
	// ("lora-a", ("mm", 3), -2, b"\x01") in msgpack.
	mp := []byte{0x94, 0xa6, 'l', 'o', 'r', 'a', '-', 'a', 0x92, 0xa2, 'm', 'm', 0x03, 0xfe, 0xc4, 0x01, 0x01}
	var parent hashcheck.Digest
	_, buf, err := hashcheck.BlockDigest(parent, []uint32{1}, mp, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := "835820" + strings.Repeat("00", 32) + "8101" + "84" + "666c6f72612d61" + "82626d6d03" + "21" + "4101"
	if got := hex.EncodeToString(buf); got != want {
		t.Fatalf("cbor\n got  %s\n want %s", got, want)
	}
	if _, _, err := hashcheck.BlockDigest(parent, []uint32{1}, []byte{0xcb, 0, 0, 0, 0, 0, 0, 0, 0}, nil); err == nil {
		t.Fatal("a float extra key hashed; want an error (unverifiable)")
	}
}
