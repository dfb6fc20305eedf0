package imageref

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSplit(t *testing.T) {
	for _, tc := range []struct{ ref, name, tag, digest string }{
		{"vllm/vllm-openai:v0.34.0", "vllm/vllm-openai", "v0.34.0", ""},
		{"vllm/vllm-openai", "vllm/vllm-openai", "", ""},
		{"localhost:5000/img", "localhost:5000/img", "", ""},
		{"localhost:5000/img:v1", "localhost:5000/img", "v1", ""},
		{"localhost/img@sha256:abc", "localhost/img", "", "sha256:abc"},
		{"ghcr.io/x/y:latest@sha256:abc", "ghcr.io/x/y", "latest", "sha256:abc"},
	} {
		name, tag, digest := Split(tc.ref)
		assert.Equal(t, []string{tc.name, tc.tag, tc.digest}, []string{name, tag, digest}, tc.ref)
	}
}
