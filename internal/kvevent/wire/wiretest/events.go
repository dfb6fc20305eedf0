package wiretest

// Gen is a generation of vLLM's event field set; each adds fields to the
// one before (the PR that added them in parentheses).
type Gen int

// Field generations.
const (
	GenOriginal  Gen = iota + 1 // block_hashes, parent_block_hash, token_ids, block_size, lora_id (#16750)
	GenMedium                   // + medium (#19737)
	GenLoraName                 // + lora_name (#27577)
	GenExtraKeys                // + extra_keys (#33304)
	GenGroup                    // + group_idx (#37688)
	GenSpec                     // + kv_cache_spec_kind, kv_cache_spec_sliding_window (#40984)
	GenNewest                   // + locality, ownership, session_id, skipped_* (newer main)
)

// Engine selects vLLM's or SGLang's schema.
type Engine int

// Engines.
const (
	VLLM Engine = iota
	SGLang
)

// Format is one wire variant.
type Format struct {
	Engine      Engine
	Gen         Gen  // vLLM only
	MapEvents   bool // tagged maps (vLLM after #42892, SGLang after #37482) instead of tagged arrays
	MapEnvelope bool // the batch as a map instead of [ts, events, rank]
}

// Stored is a BlockStored event. Hash values are uint64, int64 (SGLang) or
// []byte; nil pointers-as-any are None.
type Stored struct {
	Hashes    []any
	Parent    any
	Tokens    []uint32
	BlockSize int
	LoraID    any
	Medium    any
	LoraName  any
	Extra     []any // nil: extra_keys None
	Group     any
	SpecKind  any
	Sliding   any
	Locality  any
	SessionID any
	Metadata  any // SGLang BlockStoredWithMetadata
}

// Removed is a BlockRemoved event.
type Removed struct {
	Hashes   []any
	Medium   any
	Group    any
	Locality any
}

// Cleared is an AllBlocksCleared event.
type Cleared struct{}

// Batch is one publisher batch.
type Batch struct {
	TS     float64
	Events []any // Stored, Removed, Cleared
	Rank   any   // int or nil
}

type field struct {
	name       string
	v          any
	hasDefault bool
}

func (f Format) storedFields(e Stored) []field {
	hashes := any(e.Hashes)
	var extra any
	if e.Extra != nil {
		extra = e.Extra
	}
	if f.Engine == SGLang {
		fs := []field{{"block_hashes", hashes, false}, {"parent_block_hash", e.Parent, false},
			{"token_ids", e.Tokens, false}, {"block_size", e.BlockSize, false}, {"lora_id", e.LoraID, false},
			{"medium", e.Medium, true}}
		if e.Metadata != nil {
			fs = append(fs, field{"metadata", e.Metadata, true})
		}
		return fs
	}
	fs := []field{{"block_hashes", hashes, false}, {"parent_block_hash", e.Parent, false},
		{"token_ids", e.Tokens, false}, {"block_size", e.BlockSize, false}, {"lora_id", e.LoraID, false}}
	if f.Gen >= GenMedium {
		fs = append(fs, field{"medium", e.Medium, false})
	}
	if f.Gen >= GenLoraName {
		fs = append(fs, field{"lora_name", e.LoraName, false})
	}
	if f.Gen >= GenExtraKeys {
		fs = append(fs, field{"extra_keys", extra, true})
	}
	if f.Gen >= GenGroup {
		fs = append(fs, field{"group_idx", e.Group, true})
	}
	if f.Gen >= GenSpec {
		fs = append(fs, field{"kv_cache_spec_kind", e.SpecKind, true}, field{"kv_cache_spec_sliding_window", e.Sliding, true})
	}
	if f.Gen >= GenNewest {
		fs = append(fs, field{"locality", e.Locality, true}, field{"ownership", nil, true}, field{"session_id", e.SessionID, true},
			field{"skipped_parent_block_hash", nil, true}, field{"skipped_token_ids", nil, true}, field{"skipped_extra_keys", nil, true})
	}
	return fs
}

func (f Format) removedFields(e Removed) []field {
	fs := []field{{"block_hashes", e.Hashes, false}}
	if f.Engine == SGLang {
		return append(fs, field{"medium", e.Medium, true})
	}
	if f.Gen >= GenMedium {
		fs = append(fs, field{"medium", e.Medium, false})
	}
	if f.Gen >= GenGroup {
		fs = append(fs, field{"group_idx", e.Group, true})
	}
	if f.Gen >= GenNewest {
		fs = append(fs, field{"locality", e.Locality, true}, field{"ownership", nil, true})
	}
	return fs
}

// tagged encodes one tagged struct the way msgspec does in this format.
func (f Format) tagged(tag string, fs []field) any {
	if !f.MapEvents {
		arr := make([]any, 0, len(fs)+1)
		arr = append(arr, tag)
		for _, x := range fs {
			arr = append(arr, x.v)
		}
		return arr
	}
	m := Map{Width: len(fs) + 1, KVs: []KV{{"type", tag}}}
	for _, x := range fs {
		if x.hasDefault && x.v == nil {
			continue
		}
		m.KVs = append(m.KVs, KV{x.name, x.v})
	}
	return m
}

// EncodeBatch encodes b in format f.
func (f Format) EncodeBatch(b Batch) []byte {
	events := make([]any, 0, len(b.Events))
	for _, e := range b.Events {
		switch x := e.(type) {
		case Stored:
			events = append(events, f.tagged("BlockStored", f.storedFields(x)))
		case Removed:
			events = append(events, f.tagged("BlockRemoved", f.removedFields(x)))
		case Cleared:
			events = append(events, f.tagged("AllBlocksCleared", nil))
		}
	}
	rankKey := "data_parallel_rank"
	if f.Engine == SGLang {
		rankKey = "attn_dp_rank"
	}
	if f.MapEnvelope {
		m := Map{Width: 3, KVs: []KV{{"ts", b.TS}, {"events", events}}}
		if b.Rank != nil {
			m.KVs = append(m.KVs, KV{rankKey, b.Rank})
		}
		return Encode(m)
	}
	return Encode([]any{b.TS, events, b.Rank})
}
