package subscriber

import (
	"bytes"
	"testing"
)

func TestReplayFrames(t *testing.T) {
	seq := []byte{0, 0, 0, 0, 0, 0, 0, 7}
	end := bytes.Repeat([]byte{0xff}, 8)
	p := []byte{0x93}
	for _, tc := range []struct {
		name    string
		frames  [][]byte
		seq     []byte
		payload []byte
		ok      bool
	}{
		{"vLLM ≥ #45177 through a DEALER", [][]byte{{}, []byte("kv"), seq, p}, seq, p, true},
		{"vLLM ≥ #45177, empty topic", [][]byte{{}, {}, seq, p}, seq, p, true},
		{"vLLM ≥ #45177 end marker", [][]byte{{}, {}, end, {}}, end, []byte{}, true},
		{"legacy and SGLang", [][]byte{{}, seq, p}, seq, p, true},
		{"legacy end marker", [][]byte{{}, end, {}}, end, []byte{}, true},
		{"without the delimiter", [][]byte{[]byte("kv"), seq, p}, seq, p, true},
		{"legacy without the delimiter", [][]byte{seq, p}, seq, p, true},
		{"short sequence", [][]byte{{}, []byte("kv"), {1, 2}, p}, nil, nil, false},
		{"one frame", [][]byte{p}, nil, nil, false},
		{"too many frames", [][]byte{{}, {}, {}, seq, p}, nil, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, pl, ok := replayFrames(tc.frames)
			if ok != tc.ok || !bytes.Equal(s, tc.seq) || !bytes.Equal(pl, tc.payload) {
				t.Fatalf("replayFrames = %x, %x, %v; want %x, %x, %v", s, pl, ok, tc.seq, tc.payload, tc.ok)
			}
		})
	}
}

func TestLagPercentiles(t *testing.T) {
	var l lagRing
	for i := 1; i <= 100; i++ {
		l.add(uint32(i))
	}
	if p50, p99 := l.percentiles(); p50 != 50 || p99 != 99 {
		t.Fatalf("p50 %d p99 %d, want 50 and 99", p50, p99)
	}
	var empty lagRing
	if p50, p99 := empty.percentiles(); p50 != 0 || p99 != 0 {
		t.Fatalf("empty ring: %d %d", p50, p99)
	}
}
