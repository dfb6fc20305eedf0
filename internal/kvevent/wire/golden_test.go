package wire_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/inferencecache/operator/internal/kvevent/wire"
	"github.com/inferencecache/operator/internal/kvevent/wire/wiretest"
)

// noteExample is the annotated batch of docs' kv-events note section 1.4
// (map events, field generation "spec", rank 0), byte for byte as msgspec
// encodes it.
const noteExample = "93" + "cb41da305498100000" + "93" +
	"8b" + "a474797065" + "ab426c6f636b53746f726564" +
	"ac626c6f636b5f686173686573" + "92cf84b146b151d55111cfd43b57df56b58fb1" +
	"b1706172656e745f626c6f636b5f68617368c0" +
	"a9746f6b656e5f696473" + "980102030405060708" +
	"aa626c6f636b5f73697a6504" +
	"a76c6f72615f6964c0" + "a66d656469756da3475055" + "a96c6f72615f6e616d65c0" +
	"aa65787472615f6b65797392c0c0" +
	"a967726f75705f69647800" +
	"b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e" +
	"84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cfd43b57df56b58fb1a66d656469756da3475055a967726f75705f69647800" +
	"81a474797065b0416c6c426c6f636b73436c6561726564" +
	"00"

const (
	h1 = 0x84b146b151d55111
	h2 = 0xd43b57df56b58fb1
)

var gens = []struct {
	name string
	gen  wiretest.Gen
}{
	{"original", wiretest.GenOriginal}, {"medium", wiretest.GenMedium}, {"lora_name", wiretest.GenLoraName},
	{"extra_keys", wiretest.GenExtraKeys}, {"group", wiretest.GenGroup}, {"spec", wiretest.GenSpec}, {"newest", wiretest.GenNewest},
}

func example(bytesHashes, sglang bool) wiretest.Batch {
	var a, b any = uint64(h1), uint64(h2)
	if sglang {
		a, b = int64(-0x7b4eb94eae2aaeef), uint64(0x2bc4a820a94a704f)
	}
	if bytesHashes {
		a = append(bytes.Repeat([]byte{0xaa}, 24), 0x84, 0xb1, 0x46, 0xb1, 0x51, 0xd5, 0x51, 0x11)
		b = append(bytes.Repeat([]byte{0xbb}, 24), 0xd4, 0x3b, 0x57, 0xdf, 0x56, 0xb5, 0x8f, 0xb1)
	}
	st := wiretest.Stored{Hashes: []any{a, b}, Tokens: []uint32{1, 2, 3, 4, 5, 6, 7, 8}, BlockSize: 4, Medium: "GPU",
		Extra: []any{nil, nil}, Group: 0, SpecKind: "full_attention"}
	rm := wiretest.Removed{Hashes: []any{b}, Medium: "GPU", Group: 0}
	if sglang {
		st.Extra, st.Group, st.SpecKind, rm.Group = nil, nil, nil, nil
	}
	return wiretest.Batch{TS: 1757500000.25, Events: []any{st, rm, wiretest.Cleared{}}, Rank: 0}
}

// goldenCases are the fixture publisher's cases (test/kvevents/publisher.py
// cases()), built again with the Go fixture encoder.
func goldenCases() map[string][]byte {
	c := map[string][]byte{}
	for _, g := range gens {
		c["vllm-array-"+g.name] = wiretest.Format{Gen: g.gen}.EncodeBatch(example(false, false))
		c["vllm-map-"+g.name] = wiretest.Format{Gen: g.gen, MapEvents: true}.EncodeBatch(example(false, false))
	}
	spec := wiretest.Format{Gen: wiretest.GenSpec, MapEvents: true}
	c["vllm-map-spec-map-envelope"] = wiretest.Format{Gen: wiretest.GenSpec, MapEvents: true, MapEnvelope: true}.EncodeBatch(example(false, false))
	c["vllm-array-spec-map-envelope"] = wiretest.Format{Gen: wiretest.GenSpec, MapEnvelope: true}.EncodeBatch(example(false, false))
	c["vllm-map-spec-bytes-hashes"] = spec.EncodeBatch(example(true, false))
	c["vllm-array-spec-bytes-hashes"] = wiretest.Format{Gen: wiretest.GenSpec}.EncodeBatch(example(true, false))
	c["vllm-map-newest-all-fields"] = wiretest.Format{Gen: wiretest.GenNewest, MapEvents: true}.EncodeBatch(wiretest.Batch{
		TS: 1757500000.25, Rank: 3, Events: []any{wiretest.Stored{Hashes: []any{uint64(7)}, Parent: uint64(5),
			Tokens: []uint32{9, 70000, 151935}, BlockSize: 3, LoraID: 2, Medium: "CPU", LoraName: "adapter-a",
			Extra: []any{[]any{"adapter-a", []any{"mm", 0}, "salt"}}, Group: 1, SpecKind: "sliding_window", Sliding: 4096,
			Locality: "LOCAL", SessionID: "s1"}}})
	sg := example(false, true)
	sg.Rank = 1
	c["sglang-array"] = wiretest.Format{Engine: wiretest.SGLang}.EncodeBatch(sg)
	c["sglang-map"] = wiretest.Format{Engine: wiretest.SGLang, MapEvents: true}.EncodeBatch(sg)
	c["sglang-array-metadata"] = wiretest.Format{Engine: wiretest.SGLang}.EncodeBatch(wiretest.Batch{TS: 1757500000.25,
		Events: []any{wiretest.Stored{Hashes: []any{int64(-5)}, Parent: int64(-4), Tokens: []uint32{1, 2}, BlockSize: 2,
			Medium: "CPU_PINNED", Metadata: wiretest.Map{KVs: []wiretest.KV{{K: "cache_salt", V: "x"}}}}}})
	return c
}

var (
	pyOnce  sync.Once
	pyCases map[string][]byte
	pyErr   error
)

// publisherCases runs the Python fixture publisher (libzmq's msgpack
// peer: Debian's python3-msgpack) and returns its payloads.
func publisherCases(t *testing.T) map[string][]byte {
	t.Helper()
	pyOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		script := filepath.Join(filepath.Dir(file), "..", "..", "..", "test", "kvevents", "publisher.py")
		out, err := exec.Command("/usr/bin/python3", script, "dump").Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				err = &pyError{err, string(ee.Stderr)}
			}
			pyErr = err
			return
		}
		var hexes map[string]string
		if pyErr = json.Unmarshal(out, &hexes); pyErr != nil {
			return
		}
		pyCases = map[string][]byte{}
		for k, v := range hexes {
			if pyCases[k], pyErr = hex.DecodeString(v); pyErr != nil {
				return
			}
		}
	})
	if pyErr != nil {
		t.Fatalf("fixture publisher (/usr/bin/python3 with python3-msgpack; make packages installs it): %v", pyErr)
	}
	return pyCases
}

type pyError struct {
	err    error
	stderr string
}

func (e *pyError) Error() string { return e.err.Error() + ": " + e.stderr }

// TestGoldenBytes: the Python fixture publisher and the Go fixture encoder
// write the same bytes for every wire variant, and the note's annotated
// msgspec example is one of them.
func TestGoldenBytes(t *testing.T) {
	py := publisherCases(t)
	gocases := goldenCases()
	if len(py) != len(gocases) {
		t.Errorf("publisher has %d cases, Go encoder %d", len(py), len(gocases))
	}
	for name, want := range py {
		if got := gocases[name]; !bytes.Equal(got, want) {
			t.Errorf("%s:\n go %x\n py %x", name, got, want)
		}
	}
	note, _ := hex.DecodeString(noteExample)
	if !bytes.Equal(py["vllm-map-spec"], note) {
		t.Errorf("vllm-map-spec differs from the msgspec example:\n got  %x\n want %x", py["vllm-map-spec"], note)
	}
	// msgspec sizes the header of the 17-field BlockStored as map16.
	if !bytes.Contains(py["vllm-map-newest"], []byte{0xde, 0x00, 0x0b, 0xa4, 't', 'y', 'p', 'e'}) {
		t.Errorf("vllm-map-newest: BlockStored header is not de 00 0b: %x", py["vllm-map-newest"])
	}
}

// flat is a comparable view of a decoded event.
type flat struct {
	Kind                wire.Kind
	Hashes              []uint64
	Bytes               bool
	Parent              uint64
	HasParent           bool
	Tokens              []uint32
	BlockSize           int
	LoraID              int64
	HasLoraID           bool
	LoraName, Medium    string
	Extra               []string
	Group               int
	SpecKind            string
	SlidingWindow       int
	TS                  float64
	Rank                int
	HasRank             bool
	EventIndex, Skipped int
}

func flatten(b *wire.Batch) []flat {
	var out []flat
	for i, e := range b.Events {
		f := flat{Kind: e.Kind, Hashes: append([]uint64{}, e.Hashes...), Bytes: e.BytesHashes, Parent: e.Parent, HasParent: e.HasParent,
			Tokens: append([]uint32(nil), e.Tokens...), BlockSize: e.BlockSize, LoraID: e.LoraID, HasLoraID: e.HasLoraID,
			LoraName: e.LoraName, Medium: e.Medium, Group: e.Group, SpecKind: e.SpecKind, SlidingWindow: e.SlidingWindow,
			TS: b.TS, Rank: b.Rank, HasRank: b.HasRank, EventIndex: i, Skipped: b.Skipped}
		for _, x := range e.Extra {
			f.Extra = append(f.Extra, hex.EncodeToString(x))
		}
		out = append(out, f)
	}
	return out
}

// TestDecodeEveryVariant decodes every payload of the fixture publisher
// into the events it was built from.
func TestDecodeEveryVariant(t *testing.T) {
	py := publisherCases(t)
	base := func(bytesHashes bool, medium bool, extra, group bool, spec bool, rank int) []flat {
		st := flat{Kind: wire.BlockStored, Hashes: []uint64{h1, h2}, Bytes: bytesHashes, Tokens: []uint32{1, 2, 3, 4, 5, 6, 7, 8}, BlockSize: 4,
			TS: 1757500000.25, Rank: rank, HasRank: true}
		rm := flat{Kind: wire.BlockRemoved, Hashes: []uint64{h2}, Bytes: bytesHashes, TS: 1757500000.25, Rank: rank, HasRank: true, EventIndex: 1}
		cl := flat{Kind: wire.AllBlocksCleared, Hashes: []uint64{}, TS: 1757500000.25, Rank: rank, HasRank: true, EventIndex: 2}
		if medium {
			st.Medium, rm.Medium = "GPU", "GPU"
		}
		if extra {
			st.Extra = []string{"", ""}
		}
		_ = group // group 0 decodes as 0 either way
		if spec {
			st.SpecKind = "full_attention"
		}
		return []flat{st, rm, cl}
	}
	want := map[string][]flat{}
	for _, g := range gens {
		w := base(false, g.gen >= wiretest.GenMedium, g.gen >= wiretest.GenExtraKeys, g.gen >= wiretest.GenGroup, g.gen >= wiretest.GenSpec, 0)
		want["vllm-array-"+g.name], want["vllm-map-"+g.name] = w, w
	}
	spec := base(false, true, true, true, true, 0)
	want["vllm-map-spec-map-envelope"], want["vllm-array-spec-map-envelope"] = spec, spec
	bh := base(true, true, true, true, true, 0)
	want["vllm-map-spec-bytes-hashes"], want["vllm-array-spec-bytes-hashes"] = bh, bh
	want["vllm-map-newest-all-fields"] = []flat{{Kind: wire.BlockStored, Hashes: []uint64{7}, Parent: 5, HasParent: true,
		Tokens: []uint32{9, 70000, 151935}, BlockSize: 3, LoraID: 2, HasLoraID: true, LoraName: "adapter-a", Medium: "CPU",
		Extra: []string{hex.EncodeToString(wiretest.Encode([]any{"adapter-a", []any{"mm", 0}, "salt"}))}, Group: 1,
		SpecKind: "sliding_window", SlidingWindow: 4096, TS: 1757500000.25, Rank: 3, HasRank: true}}
	sg := base(false, true, false, false, false, 1)
	sg[0].Hashes = []uint64{h1, 0x2bc4a820a94a704f}
	sg[1].Hashes = []uint64{0x2bc4a820a94a704f}
	want["sglang-array"], want["sglang-map"] = sg, sg
	want["sglang-array-metadata"] = []flat{{Kind: wire.BlockStored, Hashes: []uint64{^uint64(4)}, Parent: ^uint64(3), HasParent: true,
		Tokens: []uint32{1, 2}, BlockSize: 2, Medium: "CPU_PINNED", TS: 1757500000.25}}

	d := wire.NewDecoder()
	for name, payload := range py {
		t.Run(name, func(t *testing.T) {
			w, ok := want[name]
			if !ok {
				t.Fatalf("no expectation for publisher case %s", name)
			}
			b, err := d.Decode(payload)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			got := flatten(b)
			for i := range got {
				if len(got[i].Hashes) == 0 {
					got[i].Hashes = []uint64{}
				}
			}
			if !reflect.DeepEqual(got, w) {
				t.Errorf("decoded\n got  %+v\n want %+v", got, w)
			}
		})
	}
}

// TestDecodeTolerates: unknown keys, unknown event types and trailing
// positional fields are skipped; a nil rank is no rank.
func TestDecodeTolerates(t *testing.T) {
	unknownKey := wiretest.Encode([]any{1.5, []any{
		wiretest.Map{KVs: []wiretest.KV{{K: "type", V: "BlockRemoved"}, {K: "origin", V: wiretest.Map{KVs: []wiretest.KV{{K: "a", V: []any{1, "x"}}}}},
			{K: "block_hashes", V: []any{uint64(9)}}, {K: "event_version", V: 2}}},
		[]any{"BlockRemoved", []any{uint64(10)}, "GPU", 0, nil, nil, "future-1", []any{1, 2}},
		[]any{"KVOffloaded", []any{1}},
		wiretest.Map{KVs: []wiretest.KV{{K: "type", V: "SomethingNew"}, {K: "x", V: 1}}},
	}, nil})
	d := wire.NewDecoder()
	b, err := d.Decode(unknownKey)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	if len(b.Events) != 2 || b.Skipped != 2 || b.HasRank || b.Events[0].Hashes[0] != 9 || b.Events[1].Hashes[0] != 10 {
		t.Fatalf("got %+v", b)
	}
}

// TestDecodeRejects: malformed and hostile payloads return an error with
// its reason, never panic, and allocate nothing sized by a forged count.
func TestDecodeRejects(t *testing.T) {
	valid := wiretest.Format{Gen: wiretest.GenSpec, MapEvents: true}.EncodeBatch(example(false, false))
	small := wire.DefaultLimits
	small.MaxHashes, small.MaxPayload = 4, 1<<10
	many := wiretest.Encode([]any{1.0, []any{[]any{"BlockRemoved", []any{1, 2, 3, 4, 5}}}, 0})
	deep := []byte{0x93, 0x00, 0x91, 0x82, 0xa4, 't', 'y', 'p', 'e', 0xac}
	deep = append(deep, []byte("BlockRemoved")...)
	deep = append(deep, 0xa6, 'o', 'r', 'i', 'g', 'i', 'n')
	for i := 0; i < 40; i++ {
		deep = append(deep, 0x91)
	}
	deep = append(deep, 0xc0)
	for _, tc := range []struct {
		name    string
		payload []byte
		limits  *wire.Limits
		reason  wire.Reason
	}{
		{"empty", nil, nil, wire.ReasonTruncated},
		{"truncated", valid[:len(valid)/2], nil, wire.ReasonTruncated},
		{"not an envelope", []byte{0xc3}, nil, wire.ReasonType},
		{"short envelope", []byte{0x91, 0x00}, nil, wire.ReasonSchema},
		{"events not a list", []byte{0x93, 0x00, 0x05, 0x00}, nil, wire.ReasonType},
		{"forged array32 count", []byte{0x93, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff, 0x00}, nil, wire.ReasonTruncated},
		{"forged map32 count", []byte{0xdf, 0x7f, 0xff, 0xff, 0xff}, nil, wire.ReasonTruncated},
		{"forged str32 length", []byte{0x93, 0x00, 0x91, 0x91, 0xdb, 0xff, 0xff, 0xff, 0xff}, nil, wire.ReasonTruncated},
		{"map event without tag", wiretest.Encode([]any{1.0, []any{wiretest.Map{KVs: []wiretest.KV{{K: "block_hashes", V: []any{1}}}}}}), nil, wire.ReasonSchema},
		{"token out of range", wiretest.Encode([]any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{uint64(1) << 40}}}}), nil, wire.ReasonRange},
		{"negative token", wiretest.Encode([]any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{-1}}}}), nil, wire.ReasonRange},
		{"hash of wrong type", wiretest.Encode([]any{1.0, []any{[]any{"BlockRemoved", []any{"x"}}}}), nil, wire.ReasonType},
		{"too many hashes", many, &small, wire.ReasonOversized},
		{"payload too big", make([]byte, 2<<10), &small, wire.ReasonOversized},
		{"nesting too deep", deep, nil, wire.ReasonDepth},
		{"reserved code", []byte{0x93, 0x00, 0x91, 0x92, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0xc1}, nil, wire.ReasonType},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := wire.NewDecoder()
			if tc.limits != nil {
				d.Limits = *tc.limits
			}
			_, err := d.Decode(tc.payload)
			var de *wire.Error
			if !asError(err, &de) {
				t.Fatalf("err = %v, want a *wire.Error", err)
			}
			if de.Reason != tc.reason {
				t.Fatalf("reason = %s (%v), want %s", de.Reason, err, tc.reason)
			}
			if !strings.HasPrefix(err.Error(), "decode kv event batch: ") {
				t.Fatalf("error %q", err)
			}
			// The decoder stays usable after a failure.
			if _, err := d.Decode(valid); tc.limits == nil && err != nil {
				t.Fatalf("decode after failure: %v", err)
			}
		})
	}
}

func asError(err error, target **wire.Error) bool {
	var e *wire.Error
	ok := errors.As(err, &e)
	if ok {
		*target = e
	}
	return ok
}

// TestDecodeAllocs: decoding a steady stream allocates nothing once the
// decoder's buffers have grown.
func TestDecodeAllocs(t *testing.T) {
	payload := wiretest.Format{Gen: wiretest.GenNewest, MapEvents: true}.EncodeBatch(example(false, false))
	d := wire.NewDecoder()
	if _, err := d.Decode(payload); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = d.Decode(payload) }); n != 0 {
		t.Fatalf("%v allocations per decode, want 0", n)
	}
}
