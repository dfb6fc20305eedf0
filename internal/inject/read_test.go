package inject

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReadObjectFindsTheSpec: the spec's bytes are found where they lie in
// the input, whatever the whitespace around them, and decode as the pod's.
func TestReadObjectFindsTheSpec(t *testing.T) {
	for _, c := range []struct {
		name, raw, spec string
	}{
		{"compact", `{"metadata":{"name":"a"},"spec":{"hostNetwork":true}}`, `{"hostNetwork":true}`},
		{"spaced", "{ \"spec\" :\n\t {\"hostNetwork\":true} , \"metadata\":{}}", `{"hostNetwork":true}`},
		{"null", `{"spec":null}`, `null`},
		{"absent", `{"metadata":{"name":"a"}}`, ``},
	} {
		t.Run(c.name, func(t *testing.T) {
			o, err := ReadObject([]byte(c.raw))
			require.NoError(t, err)
			assert.Equal(t, c.spec, string(o.spec))
			p, err := o.Pod()
			require.NoError(t, err)
			assert.Equal(t, c.name == "compact" || c.name == "spaced", p.Spec.HostNetwork)
		})
	}
}

// TestBindRefusesASpanOutsideItsInput: an Object bound to other bytes than
// it was read from is an error, not a slice out of range.
func TestBindRefusesASpanOutsideItsInput(t *testing.T) {
	o, err := ReadObject([]byte(`{"metadata":{},"spec":{"hostNetwork":true}}`))
	require.NoError(t, err)
	_, err = o.Bind([]byte(`{}`))
	assert.Error(t, err)
}
