package kvindex

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/inferencecache/operator/internal/kvevent/hashcheck"
)

// ErrTokensUnsupported is returned when a query carries token IDs but the
// pods' hash scheme cannot be reproduced by the index.
var ErrTokensUnsupported = errors.New("token IDs cannot be hashed for this hash scheme")

// HashTokens computes vLLM's sha256_cbor block hashes of a prompt's full
// blocks, as the engine puts them on the wire (the low 64 bits of each
// digest): NONE_HASH = SHA-256(CBOR(seed)), then per block
// SHA-256(CBOR([parent digest, [tokens...], None])). Only the base model
// (no extra keys) is reproducible this way.
func HashTokens(algorithm, seed string, blockSize int, tokens []uint32) ([]uint64, error) {
	if algorithm != "sha256_cbor" || seed == "" || blockSize <= 0 {
		return nil, fmt.Errorf("scheme %s/%d/%q: %w", algorithm, blockSize, seed, ErrTokensUnsupported)
	}
	buf := cborText(nil, seed)
	parent := sha256.Sum256(buf)
	n := len(tokens) / blockSize
	out := make([]uint64, 0, n)
	for b := range n {
		buf = buf[:0]
		buf = append(buf, 0x83, 0x58, 0x20)
		buf = append(buf, parent[:]...)
		buf = cborHead(buf, 4, uint64(blockSize))
		for _, t := range tokens[b*blockSize : (b+1)*blockSize] {
			buf = cborHead(buf, 0, uint64(t))
		}
		buf = append(buf, 0xf6)
		parent = sha256.Sum256(buf)
		out = append(out, binary.BigEndian.Uint64(parent[24:]))
	}
	return out, nil
}

// HashPrompt computes a prompt's full-block hashes in a scheme the index
// can reproduce: vLLM's sha256_cbor (HashTokens), SGLang's chained page
// hashes (HashPages), or LMCache's blake3 chunk hashes (HashChunks), which
// its multiprocess connector publishes for its CPU tier.
func HashPrompt(algorithm, seed string, blockSize int, tokens []uint32) ([]uint64, error) {
	switch algorithm {
	case hashcheck.LMCacheBlake3:
		return HashChunks(blockSize, tokens)
	case hashcheck.SGLangSHA256:
		return HashPages(blockSize, tokens)
	}
	return HashTokens(algorithm, seed, blockSize, tokens)
}

// HashPages computes SGLang's page hashes of a prompt's full pages as its
// KV events carry them (the first 8 bytes of each digest, big-endian):
// SHA-256 of the parent page's whole digest (none for the first page)
// followed by the page's tokens as little-endian uint32. Prompts with a
// cache salt, which SGLang hashes into the first page, are not
// reproducible this way.
func HashPages(pageSize int, tokens []uint32) ([]uint64, error) {
	return chain(hashcheck.SGLangSHA256, pageSize, tokens, func(parent *hashcheck.Digest, block []uint32) (hashcheck.Digest, uint64) {
		d := hashcheck.SGLangDigest(parent, block)
		return d, hashcheck.SGLangWire(d)
	})
}

// HashChunks computes LMCache's blake3 chunk hashes of a prompt's full
// chunks as the engine's publisher carries them (the low 64 bits of each
// digest): lmcache.v1.multiprocess.token_hasher chained from BLAKE3 of
// twelve zero bytes, each chunk BLAKE3(parent digest ‖ tokens as
// big-endian uint32).
func HashChunks(chunkSize int, tokens []uint32) ([]uint64, error) {
	buf := make([]byte, 0, 32+4*max(chunkSize, 0))
	return chain(hashcheck.LMCacheBlake3, chunkSize, tokens, func(parent *hashcheck.Digest, block []uint32) (hashcheck.Digest, uint64) {
		var d hashcheck.Digest
		d, buf = hashcheck.LMCacheDigest(parent, block, buf)
		return d, hashcheck.Low64(d)
	})
}

// chain hashes a prompt's full blocks of size tokens each with a digest
// chained over its parent's (nil for the first block), returning each
// block's wire value: the shape SGLang's pages and LMCache's chunks share.
func chain(scheme string, size int, tokens []uint32, digest func(parent *hashcheck.Digest, block []uint32) (hashcheck.Digest, uint64)) ([]uint64, error) {
	if size <= 0 {
		return nil, fmt.Errorf("scheme %s/%d: %w", scheme, size, ErrTokensUnsupported)
	}
	n := len(tokens) / size
	out := make([]uint64, 0, n)
	var parent *hashcheck.Digest
	for b := range n {
		d, v := digest(parent, tokens[b*size:(b+1)*size])
		out = append(out, v)
		parent = &d
	}
	return out, nil
}

func cborText(buf []byte, s string) []byte {
	return append(cborHead(buf, 3, uint64(len(s))), s...)
}

// cborHead appends a canonical CBOR head of a major type and argument.
func cborHead(buf []byte, major byte, v uint64) []byte {
	m := major << 5
	switch {
	case v < 24:
		return append(buf, m|byte(v))
	case v <= 0xff:
		return append(buf, m|24, byte(v))
	case v <= 0xffff:
		return binary.BigEndian.AppendUint16(append(buf, m|25), uint16(v))
	case v <= 0xffffffff:
		return binary.BigEndian.AppendUint32(append(buf, m|26), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(buf, m|27), v)
}
