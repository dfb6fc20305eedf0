package evaluate

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
)

// TestBrief: a message built from errors stays within MaxMessage bytes,
// whatever the number of failed pods: joined errors as many as fit and
// how many more, a single long one cut at a character boundary.
func TestBrief(t *testing.T) {
	pod := func(i int) error {
		return fmt.Errorf("evicting engine pod llm/engine-%03d on node gpu-%03d: Cannot evict pod as it would violate the pod's disruption budget", i, i)
	}
	many := func(n int) error {
		var errs []error
		for i := range n {
			errs = append(errs, pod(i))
		}
		return errors.Join(errs...)
	}
	long := errors.New(strings.Repeat("é", MaxMessage)) // two bytes a character
	for _, tc := range []struct {
		name     string
		err      error
		want     string // the whole message, when set
		prefix   string
		suffix   string
		maxBytes int
	}{
		{name: "one short error as is", err: pod(1), want: pod(1).Error()},
		{name: "two joined: both", err: errors.Join(pod(1), pod(2)), want: pod(1).Error() + "; " + pod(2).Error()},
		{name: "nested joins are flattened", err: errors.Join(errors.Join(pod(1)), errors.Join(pod(2))), want: pod(1).Error() + "; " + pod(2).Error()},
		{name: "200 pods: as many as fit, and how many more", err: many(200), prefix: pod(0).Error() + "; " + pod(1).Error(), suffix: " more"},
		{name: "one error too long: cut", err: long, prefix: "éé", suffix: "…"},
		{name: "a long first of two: cut, and 1 more", err: errors.Join(long, pod(1)), prefix: "éé", suffix: "…; and 1 more"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Brief(tc.err)
			assert.LessOrEqual(t, len(got), MaxMessage)
			assert.True(t, utf8.ValidString(got), "cut at a character boundary")
			if tc.want != "" {
				assert.Equal(t, tc.want, got)
				return
			}
			assert.True(t, strings.HasPrefix(got, tc.prefix), got)
			assert.True(t, strings.HasSuffix(got, tc.suffix), got)
		})
	}
	got := Brief(many(200))
	shown := strings.Count(got, "evicting engine pod")
	assert.Contains(t, got, fmt.Sprintf("; and %d more", 200-shown), "the count left out")
}
