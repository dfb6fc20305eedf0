package engineversion

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
		err  bool
	}{
		{in: "0.34.0", want: "0.34.0"},
		{in: "v0.34.0", want: "0.34.0"},
		{in: "0.34", want: "0.34.0"},
		{in: "0.5.7rc2", want: "0.5.7rc2"},
		{in: "0.5.7.post1", want: "0.5.7.post1"},
		{in: "v0.34.1-cu129", want: "0.34.1-cu129"},
		{in: "V0.33.0", want: "0.33.0"},
		{in: "latest", err: true},
		{in: "nightly-2026-12-01", err: true},
		{in: "", err: true},
		{in: "0", err: true},
		{in: "0.34.0 ", err: true},
		{in: "0.34.0;rm", err: true},
		{in: "00000.1.2", err: true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			v, err := Parse(tc.in)
			if tc.err {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, v.String())
		})
	}
}

func TestAtLeast(t *testing.T) {
	for _, tc := range []struct {
		v, o string
		want bool
	}{
		{"0.34.0", "0.34.0", true},
		{"0.34.1", "0.34.0", true},
		{"0.33.9", "0.34.0", false},
		{"1.0.0", "0.34.0", true},
		{"0.5.7rc2", "0.5.7", true},
		{"0.5.6", "0.5.7", false},
		{"0.5.6.post1", "0.5.7", false},
		{"0.6", "0.5.7", true},
	} {
		assert.Equal(t, tc.want, MustParse(tc.v).AtLeast(MustParse(tc.o)), "%s >= %s", tc.v, tc.o)
	}
}

func TestImageRelease(t *testing.T) {
	for _, tc := range []struct {
		image   string
		project Project
		want    string // "" when unknown
	}{
		{"vllm/vllm-openai:v0.34.0", VLLM, "0.34.0"},
		{"docker.io/vllm/vllm-openai:v0.33.0", VLLM, "0.33.0"},
		{"index.docker.io/vllm/vllm-openai:v0.33.0", VLLM, "0.33.0"},
		{"vllm/vllm-openai:v0.34.0@sha256:" + sha, VLLM, "0.34.0"},
		{"vllm/vllm-openai@sha256:" + sha, VLLM, ""},
		{"vllm/vllm-openai:latest", VLLM, ""},
		{"vllm/vllm-openai", VLLM, ""},
		{"lmcache/vllm-openai:v0.5.6", LMCache, "0.5.6"},
		{"lmcache/vllm-openai:v0.5.6", VLLM, ""}, // LMCache's image: the tag is LMCache's release
		{"vllm/vllm-openai:v0.34.0", LMCache, ""},
		{"ghcr.io/vllm/vllm-openai:v0.34.0", VLLM, ""}, // not the project's own repository
		{"registry.example.com:5000/vllm/vllm-openai:v0.34.0", VLLM, ""},
		{"myorg/vllm:v0.34.0", VLLM, ""},
		{"vllm-openai:v0.34.0", VLLM, ""}, // library/vllm-openai
		{"not a reference", VLLM, ""},
	} {
		t.Run(tc.image+"/"+string(tc.project), func(t *testing.T) {
			v, ok := ParseImage(tc.image).Release(tc.project)
			if tc.want == "" {
				assert.False(t, ok, "read %s", v)
				return
			}
			require.True(t, ok)
			assert.Equal(t, tc.want, v.String())
		})
	}
}

const sha = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestDetectOrder(t *testing.T) {
	for _, tc := range []struct {
		name                        string
		annotation, image, declared string
		want                        string
		source                      Source
		err                         bool
	}{
		{name: "annotation first", annotation: "0.33.0", image: "vllm/vllm-openai:v0.34.0", declared: "0.34.0", want: "0.33.0", source: FromAnnotation},
		{name: "then the image", image: "vllm/vllm-openai:v0.34.0", declared: "0.33.0", want: "0.34.0", source: FromImageTag},
		{name: "then the backend", image: "example.com/engine:v1", declared: "0.33.0", want: "0.33.0", source: FromBackend},
		{name: "unknown", image: "example.com/engine:v1", source: Unknown},
		{name: "bad annotation", annotation: "newest", image: "vllm/vllm-openai:v0.34.0", err: true, source: FromAnnotation},
		{name: "bad default", declared: "newest", err: true, source: FromBackend},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Detect(VLLM, tc.annotation, tc.image, tc.declared)
			assert.Equal(t, tc.source, d.Source)
			if tc.err {
				assert.Error(t, err)
				assert.False(t, d.Known)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want != "", d.Known)
			if tc.want != "" {
				assert.Equal(t, tc.want, d.Version.String())
			}
		})
	}
}

// TestParseErrorIsBounded: a long unreadable value (a pod annotation may
// hold hundreds of KiB) is cut in the error, which reaches admission
// warnings and logs.
func TestParseErrorIsBounded(t *testing.T) {
	_, err := Parse(strings.Repeat("x", 100_000))
	require.Error(t, err)
	assert.Less(t, len(err.Error()), 200)
}
