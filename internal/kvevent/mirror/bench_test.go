package mirror_test

import (
	"testing"

	"github.com/inferencecache/operator/internal/kvevent/mirror"
	"github.com/inferencecache/operator/internal/kvevent/wire"
	"github.com/inferencecache/operator/internal/kvevent/wire/wiretest"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// benchBatches builds a steady stream in vLLM's current format (tagged-map
// events, field generation "spec", block size 16, 64-bit hashes): a batch
// storing 32 requests' runs of 16 blocks with their token IDs, then a batch
// evicting the same 512 blocks one BlockRemoved per block, as the block pool
// emits them. It returns the payloads and the block events they hold.
func benchBatches() ([][]byte, int) {
	f := wiretest.Format{Gen: wiretest.GenSpec, MapEvents: true}
	var stores, removes []any
	h := uint64(0x9e3779b97f4a7c15)
	blocks := 0
	for r := 0; r < 32; r++ {
		var hashes []any
		var tokens []uint32
		for b := 0; b < 16; b++ {
			h = h*6364136223846793005 + 1442695040888963407
			hashes = append(hashes, h)
			for k := 0; k < 16; k++ {
				tokens = append(tokens, uint32(1000+(r*256+b*16+k)*37%150000))
			}
			removes = append(removes, wiretest.Removed{Hashes: []any{h}, Medium: "GPU", Group: 0})
		}
		extra := make([]any, 16)
		stores = append(stores, wiretest.Stored{Hashes: hashes, Tokens: tokens, BlockSize: 16, Medium: "GPU",
			Extra: extra, Group: 0, SpecKind: "full_attention"})
		blocks += 16
	}
	return [][]byte{
		f.EncodeBatch(wiretest.Batch{TS: 1.79e9, Events: stores, Rank: 0}),
		f.EncodeBatch(wiretest.Batch{TS: 1.79e9, Events: removes, Rank: 0}),
	}, 2 * blocks
}

func benchDecodeMirror(b *testing.B, forward bool) {
	payloads, events := benchBatches()
	d := wire.NewDecoder()
	m := mirror.New()
	out := make([]*pb.BlockEvent, 0, 1024)
	bytes := 0
	for _, p := range payloads {
		bytes += len(p)
	}
	b.SetBytes(int64(bytes))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, p := range payloads {
			batch, err := d.Decode(p)
			if err != nil {
				b.Fatal(err)
			}
			if forward {
				out = m.Apply(batch.Events, false, out[:0])
			} else {
				m.Apply(batch.Events, false, nil)
			}
		}
	}
	b.StopTimer()
	if m.Len() != 0 {
		b.Fatalf("mirror holds %d blocks after store+evict", m.Len())
	}
	b.ReportMetric(float64(events)*float64(b.N)/b.Elapsed().Seconds(), "blockevents/s")
}

// BenchmarkDecodeMirror: decode + mirror, the subscriber's per-batch work
// before forwarding. Run with -cpu 1 for a per-core figure.
func BenchmarkDecodeMirror(b *testing.B) { benchDecodeMirror(b, false) }

// BenchmarkDecodeMirrorForward adds building the deltas for the index.
func BenchmarkDecodeMirrorForward(b *testing.B) { benchDecodeMirror(b, true) }
