// Package hashcheck recomputes engine block hashes from the token IDs that
// BlockStored events carry, to tell whether the index can hash a router's
// tokens itself (Verified), whether the configured scheme is wrong
// (Mismatch), or whether it cannot know (Unverifiable).
//
// vLLM with --prefix-caching-hash-algo sha256_cbor hashes each block as
// SHA-256(canonical CBOR of (parent digest, tuple(tokens), extra_keys)),
// chained from NONE_HASH = SHA-256(CBOR(seed)), where the seed is
// PYTHONHASHSEED or, since vLLM #51875, "vllm-none-hash". The wire hash is
// the digest's low 64 bits. SGLang chains SHA-256 over the parent digest
// and the tokens as little-endian uint32, and sends the first 8 bytes as a
// signed int64. LMCache's multiprocess connector publishes its CPU chunks
// with its TokenHasher's "blake3": BLAKE3 chained over the parent digest
// and the chunk's tokens as big-endian uint32, from BLAKE3 of twelve zero
// bytes; the wire hash is the digest's low 64 bits, as vLLM's.
package hashcheck

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"math"

	"lukechampine.com/blake3"

	"github.com/inferencecache/operator/internal/kvevent/wire"
)

// Result is the verdict of a check, as the contract's HashCompatibility.
type Result int

// Results.
const (
	Unverifiable Result = iota
	Verified
	Mismatch
)

func (r Result) String() string {
	switch r {
	case Verified:
		return "Verified"
	case Mismatch:
		return "Mismatch"
	}
	return "Unverifiable"
}

// Seeds of vLLM's NONE_HASH.
const (
	SeedVLLM = "vllm-none-hash" // vLLM ≥ #51875 with sha256 / sha256_cbor
)

// Digest is a full 32-byte block digest.
type Digest = [32]byte

// NoneHash returns vLLM's NONE_HASH for a seed under sha256_cbor.
func NoneHash(seed string) Digest {
	var b []byte
	b = cborHead(b, 3, uint64(len(seed)))
	b = append(b, seed...)
	return sha256.Sum256(b)
}

// BlockDigest returns vLLM's sha256_cbor digest of one block. extra is the
// block's extra_keys as raw msgpack (nil for None).
func BlockDigest(parent Digest, tokens []uint32, extra []byte, buf []byte) (Digest, []byte, error) {
	b := append(buf[:0], 0x83, 0x58, 0x20)
	b = append(b, parent[:]...)
	b = cborHead(b, 4, uint64(len(tokens)))
	for _, t := range tokens {
		b = cborHead(b, 0, uint64(t))
	}
	if extra == nil {
		b = append(b, 0xf6)
	} else {
		var err error
		if b, _, err = transcode(b, extra, 8); err != nil {
			return Digest{}, b, err
		}
	}
	return sha256.Sum256(b), b, nil
}

// Low64 is vLLM's wire form of a digest.
func Low64(d Digest) uint64 { return binary.BigEndian.Uint64(d[24:]) }

// SGLangDigest returns SGLang's chained page digest (parent nil for the
// first page).
func SGLangDigest(parent *Digest, tokens []uint32) Digest {
	h := sha256.New()
	if parent != nil {
		h.Write(parent[:])
	}
	var b [4]byte
	for _, t := range tokens {
		binary.LittleEndian.PutUint32(b[:], t)
		h.Write(b[:])
	}
	var d Digest
	h.Sum(d[:0])
	return d
}

// SGLangWire is SGLang's wire form of a digest: the first 8 bytes as a
// signed int64 (kept here as its bit pattern).
func SGLangWire(d Digest) uint64 { return binary.BigEndian.Uint64(d[:8]) }

// SGLangSHA256 names SGLang's chained page hash (SGLangDigest, SGLangWire).
const SGLangSHA256 = "sglang_sha256"

// LMCacheBlake3 is the scheme name of LMCache's blake3 chunk hashes.
const LMCacheBlake3 = "lmcache_blake3"

// lmcacheNone is LMCache's NONE_HASH under blake3: its TokenHasher hashes
// (0, (0,), None), the int 0 as eight bytes and the token 0 as four.
var lmcacheNone = blake3.Sum256(make([]byte, 12))

// WholeBlocks reports whether a chunk of chunk tokens is a whole number of
// blocks of block tokens, as LMCache's connector requires of its chunk
// (block 0: the engine's block size is not known yet, nothing to hold).
func WholeBlocks(chunk, block uint32) bool {
	return chunk > 0 && (block == 0 || chunk >= block && chunk%block == 0)
}

// LMCacheDigest returns LMCache's blake3 digest of one chunk (parent nil
// for the first chunk of a prompt), as lmcache.v1.multiprocess.token_hasher
// computes it.
func LMCacheDigest(parent *Digest, tokens []uint32, buf []byte) (Digest, []byte) {
	p := &lmcacheNone
	if parent != nil {
		p = parent
	}
	b := append(buf[:0], p[:]...)
	for _, t := range tokens {
		b = binary.BigEndian.AppendUint32(b, t)
	}
	return blake3.Sum256(b), b
}

func cborHead(b []byte, major byte, n uint64) []byte {
	m := major << 5
	switch {
	case n < 24:
		return append(b, m|byte(n))
	case n <= math.MaxUint8:
		return append(b, m|24, byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, m|25), uint16(n))
	case n <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, m|26), uint32(n))
	}
	return binary.BigEndian.AppendUint64(append(b, m|27), n)
}

var errUnsupported = errors.New("extra key value has no canonical CBOR form here")

// transcode converts one msgpack value (tuples arrive as arrays) into
// canonical CBOR, as cbor2.dumps(canonical=True) writes it. Floats, maps and
// extension types are not supported: such blocks are unverifiable.
func transcode(b, mp []byte, depth int) ([]byte, []byte, error) {
	if len(mp) == 0 || depth == 0 {
		return b, nil, errUnsupported
	}
	c, rest := mp[0], mp[1:]
	be := func(n int) (uint64, []byte, error) {
		if len(rest) < n {
			return 0, nil, errUnsupported
		}
		var v uint64
		for _, x := range rest[:n] {
			v = v<<8 | uint64(x)
		}
		return v, rest[n:], nil
	}
	var n uint64
	var err error
	switch {
	case c <= 0x7f:
		return cborHead(b, 0, uint64(c)), rest, nil
	case c >= 0xe0:
		return cborHead(b, 1, uint64(-1-int64(int8(c)))), rest, nil
	case c == 0xc0:
		return append(b, 0xf6), rest, nil
	case c == 0xc2:
		return append(b, 0xf4), rest, nil
	case c == 0xc3:
		return append(b, 0xf5), rest, nil
	case c >= 0xa0 && c <= 0xbf, c == 0xd9, c == 0xda, c == 0xdb, c == 0xc4, c == 0xc5, c == 0xc6:
		major := byte(3)
		switch {
		case c >= 0xa0 && c <= 0xbf:
			n = uint64(c & 0x1f)
		case c == 0xd9 || c == 0xc4:
			n, rest, err = be(1)
		case c == 0xda || c == 0xc5:
			n, rest, err = be(2)
		default:
			n, rest, err = be(4)
		}
		if c == 0xc4 || c == 0xc5 || c == 0xc6 {
			major = 2
		}
		if err != nil || uint64(len(rest)) < n {
			return b, nil, errUnsupported
		}
		b = cborHead(b, major, n)
		return append(b, rest[:n]...), rest[n:], nil
	case c >= 0x90 && c <= 0x9f, c == 0xdc, c == 0xdd:
		switch {
		case c <= 0x9f:
			n = uint64(c & 0x0f)
		case c == 0xdc:
			n, rest, err = be(2)
		default:
			n, rest, err = be(4)
		}
		if err != nil || n > uint64(len(rest)) {
			return b, nil, errUnsupported
		}
		b = cborHead(b, 4, n)
		for i := uint64(0); i < n; i++ {
			if b, rest, err = transcode(b, rest, depth-1); err != nil {
				return b, nil, err
			}
		}
		return b, rest, nil
	case c >= 0xcc && c <= 0xcf:
		v, r, err := be(1 << (c - 0xcc))
		if err != nil {
			return b, nil, err
		}
		return cborHead(b, 0, v), r, nil
	case c >= 0xd0 && c <= 0xd3:
		w := 1 << (c - 0xd0)
		v, r, err := be(w)
		if err != nil {
			return b, nil, err
		}
		shift := 64 - 8*w
		s := int64(v<<shift) >> shift
		if s >= 0 {
			return cborHead(b, 0, uint64(s)), r, nil
		}
		return cborHead(b, 1, uint64(-1-s)), r, nil
	}
	return b, nil, errUnsupported
}

// Scheme names what a Checker recomputes.
type Scheme struct {
	// Algorithm is "sha256_cbor", "sglang_sha256" or LMCacheBlake3;
	// anything else (vLLM's default pickle "sha256", "xxhash") is
	// Unverifiable.
	Algorithm string
	// Seeds to try for vLLM's NONE_HASH, e.g. SeedVLLM and a PYTHONHASHSEED
	// value; the first that matches is kept.
	Seeds []string
}

// Checker checks BlockStored events and keeps the verdict. It remembers the
// digests of blocks it verified (up to a bound) so runs that continue an
// earlier prompt can be checked too.
type Checker struct {
	scheme  Scheme
	seed    string
	none    Digest
	known   map[uint64]Digest
	limit   int
	buf     []byte
	Checked uint64
	Matched uint64
	Failed  uint64
	result  Result
}

// New returns a checker for a scheme.
func New(s Scheme) *Checker {
	if len(s.Seeds) == 0 {
		s.Seeds = []string{SeedVLLM}
	}
	return &Checker{scheme: s, known: map[uint64]Digest{}, limit: 100_000}
}

// Result is the verdict so far: Mismatch once any checked run failed,
// Verified once one matched and none failed, Unverifiable otherwise.
func (c *Checker) Result() Result { return c.result }

// Seed is the NONE_HASH seed that matched, if any.
func (c *Checker) Seed() string { return c.seed }

// Check checks one event; it returns the event's verdict.
func (c *Checker) Check(e *wire.Event) Result {
	if e.Kind != wire.BlockStored || e.BlockSize <= 0 || len(e.Hashes) == 0 || len(e.Tokens) != len(e.Hashes)*e.BlockSize {
		return Unverifiable
	}
	if e.Extra != nil && len(e.Extra) != len(e.Hashes) {
		return Unverifiable
	}
	var r Result
	switch c.scheme.Algorithm {
	case "sha256_cbor":
		r = c.checkVLLM(e)
	case SGLangSHA256:
		r = c.checkSGLang(e)
	case LMCacheBlake3:
		r = c.checkLMCache(e)
	default:
		return Unverifiable
	}
	switch r {
	case Verified:
		c.Checked++
		c.Matched++
		if c.result == Unverifiable {
			c.result = Verified
		}
	case Mismatch:
		c.Checked++
		c.Failed++
		c.result = Mismatch
	}
	return r
}

func (c *Checker) remember(h uint64, d Digest) {
	if len(c.known) >= c.limit {
		clear(c.known)
	}
	c.known[h] = d
}

func (c *Checker) chain(parent Digest, e *wire.Event) (bool, error) {
	var err error
	for i, h := range e.Hashes {
		var extra []byte
		if e.Extra != nil {
			extra = e.Extra[i]
		}
		var d Digest
		if d, c.buf, err = BlockDigest(parent, e.Tokens[i*e.BlockSize:(i+1)*e.BlockSize], extra, c.buf); err != nil {
			return false, err
		}
		if Low64(d) != h {
			return false, nil
		}
		c.remember(h, d)
		parent = d
	}
	return true, nil
}

func (c *Checker) checkVLLM(e *wire.Event) Result {
	if e.HasParent {
		p, ok := c.known[e.Parent]
		if !ok {
			return Unverifiable
		}
		ok, err := c.chain(p, e)
		if err != nil {
			return Unverifiable
		}
		if ok {
			return Verified
		}
		return Mismatch
	}
	if c.seed != "" {
		ok, err := c.chain(c.none, e)
		switch {
		case err != nil:
			return Unverifiable
		case ok:
			return Verified
		}
		return Mismatch
	}
	for _, s := range c.scheme.Seeds {
		ok, err := c.chain(NoneHash(s), e)
		if err != nil {
			return Unverifiable
		}
		if ok {
			c.seed, c.none = s, NoneHash(s)
			return Verified
		}
	}
	return Mismatch
}

func (c *Checker) checkSGLang(e *wire.Event) Result {
	return c.chainFrom(e, func(parent *Digest, tokens []uint32) (Digest, uint64) {
		d := SGLangDigest(parent, tokens)
		return d, SGLangWire(d)
	})
}

func (c *Checker) checkLMCache(e *wire.Event) Result {
	if e.Extra != nil {
		return Unverifiable
	}
	return c.chainFrom(e, func(parent *Digest, tokens []uint32) (Digest, uint64) {
		var d Digest
		d, c.buf = LMCacheDigest(parent, tokens, c.buf)
		return d, Low64(d)
	})
}

// chainFrom checks an event's blocks with a chained digest whose first
// block has no parent (nil), from the event's parent when it has one.
func (c *Checker) chainFrom(e *wire.Event, digest func(parent *Digest, tokens []uint32) (Digest, uint64)) Result {
	var parent *Digest
	if e.HasParent {
		p, ok := c.known[e.Parent]
		if !ok {
			return Unverifiable
		}
		parent = &p
	}
	for i, h := range e.Hashes {
		d, wire := digest(parent, e.Tokens[i*e.BlockSize:(i+1)*e.BlockSize])
		if wire != h {
			return Mismatch
		}
		c.remember(h, d)
		parent = &d
	}
	return Verified
}
