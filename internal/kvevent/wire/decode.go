// Package wire decodes the KV-cache event batches that vLLM and SGLang
// publish on their ZeroMQ PUB socket (frame 2 of [topic, seq, payload]).
//
// One Decoder accepts every form an engine in the field sends: the batch
// envelope as a msgpack array [ts, events, rank] or a map with those keys;
// events as tagged arrays (positional, vLLM before mid-2026 and SGLang before
// September 2026) or tagged maps (msgspec's default since then); every
// BlockStored, BlockRemoved and AllBlocksCleared field including the optional
// ones; block hashes as unsigned, signed (SGLang) or bytes (vLLM with
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0). Unknown keys, trailing array
// elements and unknown event types are skipped.
//
// The decoder never panics and never allocates in proportion to a length a
// payload claims: every count is checked against the bytes left and against
// Limits before anything is sized by it. Malformed input returns a *Error
// whose Reason names the failure for the decode-errors metric.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// Reason classifies a decode failure; it is the label of the decode-errors
// metric, so its values are API.
type Reason string

// Decode failure reasons.
const (
	ReasonTruncated Reason = "truncated" // a value runs past the end of the payload
	ReasonType      Reason = "type"      // a value has a type the schema does not allow
	ReasonRange     Reason = "range"     // a number does not fit its field
	ReasonDepth     Reason = "depth"     // nesting deeper than Limits.MaxDepth
	ReasonOversized Reason = "oversized" // payload, events, hashes or tokens over Limits
	ReasonSchema    Reason = "schema"    // a required part (envelope events, event tag) is missing
)

// Error is a decode failure.
type Error struct {
	Reason Reason
	Err    error
}

func (e *Error) Error() string { return fmt.Sprintf("decode kv event batch: %s: %v", e.Reason, e.Err) }

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

var (
	errTruncated = errors.New("value runs past the end of the payload")
	errType      = errors.New("unexpected msgpack type")
	errRange     = errors.New("number out of range")
	errDepth     = errors.New("nesting too deep")
)

func classify(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	switch {
	case errors.Is(err, errTruncated):
		return &Error{Reason: ReasonTruncated, Err: err}
	case errors.Is(err, errType):
		return &Error{Reason: ReasonType, Err: err}
	case errors.Is(err, errRange):
		return &Error{Reason: ReasonRange, Err: err}
	case errors.Is(err, errDepth):
		return &Error{Reason: ReasonDepth, Err: err}
	}
	return &Error{Reason: ReasonSchema, Err: err}
}

func oversized(format string, a ...any) error {
	return &Error{Reason: ReasonOversized, Err: fmt.Errorf(format, a...)}
}

func schema(format string, a ...any) error {
	return &Error{Reason: ReasonSchema, Err: fmt.Errorf(format, a...)}
}

// Limits bound what one payload may make the decoder hold.
type Limits struct {
	MaxPayload      int // bytes of one payload
	MaxEvents       int // events in one batch
	MaxHashes       int // block hashes in one event
	MaxTokens       int // token IDs in one event
	MaxBatchHashes  int // block hashes in one batch, all events together
	MaxBatchTokens  int // token IDs in one batch, all events together
	MaxStringLength int // a medium, LoRA name or spec kind
	MaxDepth        int // nesting of values that are skipped (extra keys, unknown fields)
}

// DefaultLimits are generous for real engines (a batch is one scheduler
// step) and keep one decoded batch under about 40 MiB.
var DefaultLimits = Limits{
	MaxPayload:      64 << 20,
	MaxEvents:       1 << 20,
	MaxHashes:       100_000,
	MaxTokens:       1 << 20,
	MaxBatchHashes:  1 << 20,
	MaxBatchTokens:  4 << 20,
	MaxStringLength: 256,
	MaxDepth:        16,
}

// Kind is an event type.
type Kind uint8

// Event kinds.
const (
	BlockStored Kind = iota + 1
	BlockRemoved
	AllBlocksCleared
)

func (k Kind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "Unknown"
}

// Event is one decoded KV-cache event. Slices point into the Decoder's
// buffers and the payload: they are valid until the next Decode.
type Event struct {
	Kind Kind
	// Hashes are the block hashes as 64-bit keys: an integer's two's
	// complement bit pattern (SGLang's signed int64 keeps its pattern), or
	// for a bytes hash its last 8 bytes big-endian, which is vLLM's
	// integer form of the same digest.
	Hashes []uint64
	// BytesHashes is set when the engine sent the hashes as bytes.
	BytesHashes bool
	// Parent is the hash of the block before Hashes[0] (HasParent false:
	// the run starts at the first block of the prompt).
	Parent    uint64
	HasParent bool
	// Tokens are the token IDs of the stored blocks (may be empty: tiers
	// such as CPU offloading send none).
	Tokens    []uint32
	BlockSize int
	LoraID    int64
	HasLoraID bool
	LoraName  string
	// Medium is the tier ("GPU", "CPU", ...); empty when the engine sent none.
	Medium string
	// Extra holds each block's extra_keys as raw msgpack (nil for None); nil
	// when the event carries no extra_keys.
	Extra [][]byte
	// Group is the KV-cache group (hybrid models); 0 when absent.
	Group         int
	SpecKind      string
	SlidingWindow int
}

// Batch is one decoded publisher batch.
type Batch struct {
	TS      float64
	Rank    int
	HasRank bool
	Events  []Event
	// Skipped counts events of an unknown type that were ignored.
	Skipped int
}

// Decoder decodes batches, reusing its buffers: the Batch it returns is
// valid until the next call. A Decoder is not safe for concurrent use.
type Decoder struct {
	Limits Limits

	batch  Batch
	hashes []uint64
	tokens []uint32
	extra  [][]byte
}

// NewDecoder returns a decoder with DefaultLimits.
func NewDecoder() *Decoder { return &Decoder{Limits: DefaultLimits} }

// Decode decodes one payload. On error the batch is dropped whole.
func (d *Decoder) Decode(payload []byte) (*Batch, error) {
	if d.Limits.MaxPayload == 0 {
		d.Limits = DefaultLimits
	}
	if len(payload) > d.Limits.MaxPayload {
		return nil, oversized("payload of %d bytes over the limit of %d", len(payload), d.Limits.MaxPayload)
	}
	d.batch = Batch{Events: d.batch.Events[:0]}
	d.hashes = d.hashes[:0]
	d.tokens = d.tokens[:0]
	d.extra = d.extra[:0]
	r := reader{b: payload}
	if err := d.envelope(&r); err != nil {
		d.batch.Events = d.batch.Events[:0]
		return nil, classify(err)
	}
	return &d.batch, nil
}

func (d *Decoder) envelope(r *reader) error {
	if r.isMap() {
		n, err := r.mapHeader()
		if err != nil {
			return err
		}
		seen := false
		for k := 0; k < n; k++ {
			key, err := r.str()
			if err != nil {
				return err
			}
			switch string(key) {
			case "ts":
				if d.batch.TS, err = r.float(); err != nil {
					return err
				}
			case "events":
				if err = d.events(r); err != nil {
					return err
				}
				seen = true
			case "data_parallel_rank", "attn_dp_rank":
				if err = d.rank(r); err != nil {
					return err
				}
			default:
				if err = r.skip(d.Limits.MaxDepth); err != nil {
					return err
				}
			}
		}
		if !seen {
			return schema("envelope map without events")
		}
		return nil
	}
	n, err := r.arrayHeader()
	if err != nil {
		return err
	}
	if n < 2 {
		return schema("envelope array of %d elements, want [ts, events, rank?]", n)
	}
	if d.batch.TS, err = r.float(); err != nil {
		return err
	}
	if err = d.events(r); err != nil {
		return err
	}
	if n >= 3 {
		if err = d.rank(r); err != nil {
			return err
		}
	}
	return r.skipN(n-3, d.Limits.MaxDepth)
}

func (d *Decoder) rank(r *reader) error {
	if r.nextIsNil() {
		return nil
	}
	v, err := r.int()
	if err != nil {
		return err
	}
	if v < 0 || v > 1<<16 {
		return errRange
	}
	d.batch.Rank, d.batch.HasRank = int(v), true
	return nil
}

func (d *Decoder) events(r *reader) error {
	n, err := r.arrayHeader()
	if err != nil {
		return err
	}
	if n > d.Limits.MaxEvents {
		return oversized("%d events in a batch over the limit of %d", n, d.Limits.MaxEvents)
	}
	for k := 0; k < n; k++ {
		d.batch.Events = append(d.batch.Events, Event{})
		ev := &d.batch.Events[len(d.batch.Events)-1]
		if r.isMap() {
			err = d.mapEvent(r, ev)
		} else {
			err = d.arrayEvent(r, ev)
		}
		if err != nil {
			return err
		}
		if ev.Kind == 0 {
			d.batch.Events = d.batch.Events[:len(d.batch.Events)-1]
			d.batch.Skipped++
		}
	}
	return nil
}

// kindOf maps a tag to a kind; 0 for an unknown tag.
func kindOf(tag []byte) Kind {
	switch string(tag) {
	case "BlockStored", "BlockStoredWithMetadata":
		return BlockStored
	case "BlockRemoved":
		return BlockRemoved
	case "AllBlocksCleared":
		return AllBlocksCleared
	}
	return 0
}

func (d *Decoder) mapEvent(r *reader, ev *Event) error {
	n, err := r.mapHeader()
	if err != nil {
		return err
	}
	tagged := false
	for k := 0; k < n; k++ {
		key, err := r.str()
		if err != nil {
			return err
		}
		if string(key) == "type" {
			tag, err := r.str()
			if err != nil {
				return err
			}
			ev.Kind, tagged = kindOf(tag), true
			continue
		}
		if err = d.field(r, ev, fieldOf(key)); err != nil {
			return err
		}
	}
	if !tagged {
		return schema("event map without a type tag")
	}
	if ev.Kind != BlockStored {
		ev.Tokens, ev.Extra = nil, nil
	}
	return nil
}

// fieldID names an event field the decoder reads; fOther is skipped.
type fieldID uint8

const (
	fOther fieldID = iota
	fBlockHashes
	fParent
	fTokenIDs
	fBlockSize
	fLoraID
	fMedium
	fLoraName
	fExtraKeys
	fGroup
	fSpecKind
	fSlidingWindow
	fMetadata
)

func fieldOf(key []byte) fieldID {
	switch string(key) {
	case "block_hashes":
		return fBlockHashes
	case "parent_block_hash":
		return fParent
	case "token_ids":
		return fTokenIDs
	case "block_size":
		return fBlockSize
	case "lora_id":
		return fLoraID
	case "medium":
		return fMedium
	case "lora_name":
		return fLoraName
	case "extra_keys":
		return fExtraKeys
	case "group_idx":
		return fGroup
	case "kv_cache_spec_kind":
		return fSpecKind
	case "kv_cache_spec_sliding_window":
		return fSlidingWindow
	}
	// locality, ownership, session_id, skipped_*, metadata and any key a
	// newer engine adds.
	return fOther
}

// Positional field order of the array (array_like) events, after the tag:
// vLLM's declaration order (#16750, #19737, #27577, #33304, #37688, #40984,
// then locality, ownership, session_id, skipped_*), which SGLang's shorter
// BlockStored and BlockRemoved are prefixes of.
var (
	storedFields = [...]fieldID{fBlockHashes, fParent, fTokenIDs, fBlockSize, fLoraID, fMedium,
		fLoraName, fExtraKeys, fGroup, fSpecKind, fSlidingWindow}
	removedFields = [...]fieldID{fBlockHashes, fMedium, fGroup}
)

func (d *Decoder) arrayEvent(r *reader, ev *Event) error {
	n, err := r.arrayHeader()
	if err != nil {
		return err
	}
	if n == 0 {
		return schema("empty event array")
	}
	tag, err := r.str()
	if err != nil {
		return err
	}
	ev.Kind = kindOf(tag)
	var names []fieldID
	switch ev.Kind {
	case BlockStored:
		names = storedFields[:]
	case BlockRemoved:
		names = removedFields[:]
	}
	for k := 1; k < n; k++ {
		if k-1 < len(names) {
			id := names[k-1]
			// SGLang's BlockStoredWithMetadata puts a metadata map where
			// vLLM has lora_name.
			if id == fLoraName && r.isMap() {
				id = fMetadata
			}
			if err = d.field(r, ev, id); err != nil {
				return err
			}
			continue
		}
		if err = r.skip(d.Limits.MaxDepth); err != nil {
			return err
		}
	}
	return nil
}

func (d *Decoder) field(r *reader, ev *Event, id fieldID) error {
	var err error
	switch id {
	case fBlockHashes:
		return d.blockHashes(r, ev)
	case fParent:
		if r.nextIsNil() {
			return nil
		}
		ev.Parent, _, err = hash(r)
		ev.HasParent = err == nil
		return err
	case fTokenIDs:
		return d.tokenIDs(r, ev)
	case fBlockSize:
		return optionalInt(r, 1<<20, &ev.BlockSize)
	case fLoraID:
		if r.nextIsNil() {
			return nil
		}
		ev.LoraID, err = r.int()
		ev.HasLoraID = err == nil
		return err
	case fMedium:
		ev.Medium, err = d.text(r)
		return err
	case fLoraName:
		ev.LoraName, err = d.text(r)
		return err
	case fExtraKeys:
		return d.extraKeys(r, ev)
	case fGroup:
		return optionalInt(r, 1<<15, &ev.Group)
	case fSpecKind:
		ev.SpecKind, err = d.text(r)
		return err
	case fSlidingWindow:
		return optionalInt(r, 1<<31, &ev.SlidingWindow)
	}
	return r.skip(d.Limits.MaxDepth)
}

// optionalInt reads None (leaving *v) or an integer in [0, max].
func optionalInt(r *reader, max int64, v *int) error {
	if r.nextIsNil() {
		return nil
	}
	n, err := r.int()
	if err != nil {
		return err
	}
	if n < 0 || n > max {
		return errRange
	}
	*v = int(n)
	return nil
}

// known strings are returned without allocating.
var known = map[string]string{}

func init() {
	for _, s := range []string{"GPU", "CPU", "STORAGE", "DISK", "CPU_PINNED", "EXTERNAL",
		"full_attention", "mla_attention", "sink_full_attention", "sliding_window",
		"chunked_local_attention", "mamba", "cross_attention", "encoder_only_attention"} {
		known[s] = s
	}
}

func (d *Decoder) text(r *reader) (string, error) {
	if r.nextIsNil() {
		return "", nil
	}
	b, err := r.str()
	if err != nil {
		return "", err
	}
	if s, ok := known[string(b)]; ok {
		return s, nil
	}
	if len(b) > d.Limits.MaxStringLength {
		return "", oversized("string of %d bytes over the limit of %d", len(b), d.Limits.MaxStringLength)
	}
	return string(b), nil
}

// hash reads one block hash: an integer of any width (its 64-bit pattern)
// or bytes (the last 8 bytes, big-endian).
func hash(r *reader) (uint64, bool, error) {
	c, err := r.peek()
	if err != nil {
		return 0, false, err
	}
	if c == 0xc4 || c == 0xc5 || c == 0xc6 {
		b, err := r.str()
		if err != nil {
			return 0, false, err
		}
		if len(b) > 8 {
			b = b[len(b)-8:]
		}
		var v uint64
		for _, x := range b {
			v = v<<8 | uint64(x)
		}
		return v, true, nil
	}
	v, _, err := r.intBits()
	return v, false, err
}

func (d *Decoder) blockHashes(r *reader, ev *Event) error {
	if r.nextIsNil() {
		return nil
	}
	n, err := r.arrayHeader()
	if err != nil {
		return err
	}
	if n > d.Limits.MaxHashes {
		return oversized("%d block hashes in an event over the limit of %d", n, d.Limits.MaxHashes)
	}
	if len(d.hashes)+n > d.Limits.MaxBatchHashes {
		return oversized("more than %d block hashes in a batch", d.Limits.MaxBatchHashes)
	}
	start := len(d.hashes)
	d.hashes = slices.Grow(d.hashes, n)
	for k := 0; k < n; k++ {
		// Fast path: uint64, the form of almost every vLLM hash.
		if i := r.i; i+8 < len(r.b) && r.b[i] == 0xcf {
			d.hashes = append(d.hashes, binary.BigEndian.Uint64(r.b[i+1:i+9]))
			r.i += 9
			continue
		}
		v, isBytes, err := hash(r)
		if err != nil {
			return err
		}
		ev.BytesHashes = ev.BytesHashes || isBytes
		d.hashes = append(d.hashes, v)
	}
	ev.Hashes = d.hashes[start:len(d.hashes):len(d.hashes)]
	return nil
}

func (d *Decoder) tokenIDs(r *reader, ev *Event) error {
	if r.nextIsNil() {
		return nil
	}
	n, err := r.arrayHeader()
	if err != nil {
		return err
	}
	if n > d.Limits.MaxTokens {
		return oversized("%d token IDs in an event over the limit of %d", n, d.Limits.MaxTokens)
	}
	if len(d.tokens)+n > d.Limits.MaxBatchTokens {
		return oversized("more than %d token IDs in a batch", d.Limits.MaxBatchTokens)
	}
	start := len(d.tokens)
	d.tokens = slices.Grow(d.tokens, n)
	for k := 0; k < n; k++ {
		// Fast path: positive fixint and uint8/16/32, the forms msgspec
		// writes for token IDs.
		var v uint64
		b, i := r.b, r.i
		switch {
		case i < len(b) && b[i] <= 0x7f:
			v = uint64(b[i])
			r.i++
		case i+2 < len(b) && b[i] == 0xcd:
			v = uint64(b[i+1])<<8 | uint64(b[i+2])
			r.i += 3
		case i+4 < len(b) && b[i] == 0xce:
			v = uint64(b[i+1])<<24 | uint64(b[i+2])<<16 | uint64(b[i+3])<<8 | uint64(b[i+4])
			r.i += 5
		default:
			bits, neg, err := r.intBits()
			if err != nil {
				return err
			}
			if neg || bits > 0xffffffff {
				return errRange
			}
			v = bits
		}
		d.tokens = append(d.tokens, uint32(v))
	}
	ev.Tokens = d.tokens[start:len(d.tokens):len(d.tokens)]
	return nil
}

func (d *Decoder) extraKeys(r *reader, ev *Event) error {
	if r.nextIsNil() {
		return nil
	}
	n, err := r.arrayHeader()
	if err != nil {
		return err
	}
	if n > d.Limits.MaxHashes || len(d.extra)+n > d.Limits.MaxBatchHashes {
		return oversized("%d extra keys in an event over the limit", n)
	}
	start := len(d.extra)
	for k := 0; k < n; k++ {
		if r.nextIsNil() {
			d.extra = append(d.extra, nil)
			continue
		}
		raw, err := r.raw(d.Limits.MaxDepth)
		if err != nil {
			return err
		}
		d.extra = append(d.extra, raw)
	}
	ev.Extra = d.extra[start:len(d.extra):len(d.extra)]
	return nil
}
