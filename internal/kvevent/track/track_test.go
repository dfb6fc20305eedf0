package track_test

import (
	"testing"

	"github.com/inferencecache/operator/internal/kvevent/track"
)

func TestLive(t *testing.T) {
	type step struct {
		live     bool // live stream or replay
		seq      uint64
		want     track.Verdict
		from, to uint64
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"in order", []step{{true, 0, track.Apply, 0, 0}, {true, 1, track.Apply, 0, 0}, {true, 2, track.Apply, 0, 0}}},
		{"late join replays from 0", []step{{true, 5, track.Gap, 0, 4}, {false, 0, track.Apply, 0, 0}}},
		{"gap", []step{{true, 0, track.Apply, 0, 0}, {true, 3, track.Gap, 1, 2}, {false, 1, track.Apply, 0, 0},
			{false, 2, track.Apply, 0, 0}, {false, 3, track.Apply, 0, 0}, {false, 4, track.Apply, 0, 0},
			// live 4 arrives after the replay covered it
			{true, 4, track.Duplicate, 0, 0}, {true, 5, track.Apply, 0, 0}}},
		{"restart: the sequence goes back", []step{{true, 0, track.Apply, 0, 0}, {true, 1, track.Apply, 0, 0}, {true, 0, track.Restart, 0, 0}}},
		{"restart: the same sequence again", []step{{true, 0, track.Apply, 0, 0}, {true, 0, track.Restart, 0, 0}}},
		{"replay window exceeded", []step{{true, 0, track.Apply, 0, 0}, {true, 50, track.Gap, 1, 49}, {false, 20, track.Gap, 1, 19}}},
		{"replayed duplicate", []step{{true, 0, track.Apply, 0, 0}, {true, 2, track.Gap, 1, 1}, {false, 0, track.Duplicate, 0, 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r track.Rank
			for i, s := range tc.steps {
				var v track.Verdict
				var from, to uint64
				if s.live {
					v, from, to = r.Live(s.seq)
				} else {
					v, from, to = r.Replayed(s.seq)
				}
				if v != s.want || from != s.from || to != s.to {
					t.Fatalf("step %d (seq %d): %v [%d,%d], want %v [%d,%d]", i, s.seq, v, from, to, s.want, s.from, s.to)
				}
				switch v {
				case track.Apply:
					r.Applied(s.seq)
				case track.Restart:
					r.Restarted(s.seq)
				}
			}
		})
	}
}
