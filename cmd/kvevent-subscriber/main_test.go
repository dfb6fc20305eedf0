package main

import (
	"context"
	"strings"
	"testing"
)

func TestOffsetEndpoint(t *testing.T) {
	for _, tc := range []struct {
		ep   string
		rank int
		want string
		err  bool
	}{
		{"tcp://127.0.0.1:5557", 0, "tcp://127.0.0.1:5557", false},
		{"tcp://127.0.0.1:5557", 3, "tcp://127.0.0.1:5560", false},
		{"tcp://[::1]:5557", 1, "tcp://[::1]:5558", false},
		{"ipc:///var/run/kvevents/pub.sock", 0, "ipc:///var/run/kvevents/pub.sock", false},
		{"ipc:///var/run/kvevents/pub.sock", 1, "", true},
		{"tcp://127.0.0.1", 1, "", true},
	} {
		got, err := offsetEndpoint(tc.ep, tc.rank)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("offsetEndpoint(%q, %d) = %q, %v; want %q, error %v", tc.ep, tc.rank, got, err, tc.want, tc.err)
		}
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--engine", "trtllm"},
		{"--data-parallel-size", "0"},
		{"--data-parallel-size", "2", "--endpoint", "ipc:///tmp/x.sock"},
	} {
		err := run(context.Background(), args)
		if err == nil || strings.ToLower(err.Error()[:1]) != err.Error()[:1] {
			t.Errorf("run(%v) = %v, want a lower-case error", args, err)
		}
	}
}
