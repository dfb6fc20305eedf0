package redisstore

import (
	"fmt"
	"testing"
)

func TestHashHexIsPercent016x(t *testing.T) {
	for _, h := range []uint64{0, 1, 0xabc, 1 << 63, ^uint64(0), 0x0123456789abcdef} {
		if got, want := hashHex(h), fmt.Sprintf("%016x", h); got != want {
			t.Fatalf("hashHex(%#x) = %q, want %q", h, got, want)
		}
	}
}
