package main

import (
	"strings"
	"testing"

	"github.com/inferencecache/operator/internal/kvindex"
)

func TestParseSGLangIndexers(t *testing.T) {
	got, err := parseSGLangIndexers([]string{"team-a/cache=:50051", "team-b/cache=127.0.0.1:50052"})
	if err != nil {
		t.Fatal(err)
	}
	want := []sglangBinding{{kvindex.BackendRef{Namespace: "team-a", Name: "cache"}, ":50051"}, {kvindex.BackendRef{Namespace: "team-b", Name: "cache"}, "127.0.0.1:50052"}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("got %v, want %v", got, want)
	}
	for _, tc := range []struct {
		values []string
		err    string
	}{
		{[]string{"team-a/cache"}, "want namespace/name=host:port"},
		{[]string{"cache=:50051"}, "want namespace/name=host:port"},
		{[]string{"team-a/=:50051"}, "want namespace/name=host:port"},
		{[]string{"a/b/c=:50051"}, "want namespace/name=host:port"},
		{[]string{"team-a/cache=50051"}, "missing port"},
		{[]string{"team-a/cache=:50051", "team-a/cache=:50052"}, "one listener"},
		{[]string{"team-a/cache=:50051", "team-b/cache=:50051"}, "one listener"},
	} {
		if _, err := parseSGLangIndexers(tc.values); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%q: %v, want an error containing %q", tc.values, err, tc.err)
		}
	}
}
