package wire_test

import (
	"errors"
	"testing"

	"github.com/inferencecache/operator/internal/kvevent/wire"
)

// FuzzDecode: arbitrary payloads never panic the decoder, every failure is
// a *wire.Error with a reason, and what decodes stays within the payload's
// size (no element is invented: each hash, token and event takes at least
// one byte of input) and the limits.
func FuzzDecode(f *testing.F) {
	for _, p := range goldenCases() {
		f.Add(p)
	}
	f.Add([]byte{0x93, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0xdf, 0x00, 0x00, 0x00, 0x02, 0xa6, 'e', 'v', 'e', 'n', 't', 's', 0x90})
	d := wire.NewDecoder()
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := d.Decode(payload)
		if err != nil {
			var de *wire.Error
			if !errors.As(err, &de) || de.Reason == "" {
				t.Fatalf("error %v is not a *wire.Error with a reason", err)
			}
			return
		}
		hashes, tokens := 0, 0
		for _, e := range b.Events {
			if e.Kind < wire.BlockStored || e.Kind > wire.AllBlocksCleared {
				t.Fatalf("event of kind %d", e.Kind)
			}
			hashes += len(e.Hashes)
			tokens += len(e.Tokens)
			if len(e.Hashes) > d.Limits.MaxHashes || len(e.Tokens) > d.Limits.MaxTokens {
				t.Fatalf("event over the limits: %d hashes, %d tokens", len(e.Hashes), len(e.Tokens))
			}
		}
		if len(b.Events)+hashes+tokens > len(payload) {
			t.Fatalf("%d events, %d hashes, %d tokens from %d bytes", len(b.Events), hashes, tokens, len(payload))
		}
	})
}
