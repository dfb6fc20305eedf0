package evaluate

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxMessage is the longest condition message or event note the operator
// builds from an error: the events API refuses a note over 1 kB, and a
// condition message that grows with the number of failed pods could pass
// the CRD's limit and make the API server refuse the whole status.
const MaxMessage = 1024

// Brief is err's message in at most MaxMessage bytes: the errors it joins
// (errors.Join, nested too), as many as fit, then how many more were
// left out; an error too long on its own is cut at a character boundary.
func Brief(err error) string {
	parts := leaves(err)
	more := func(n int) string {
		if n == 0 {
			return ""
		}
		return fmt.Sprintf("; and %d more", n)
	}
	var b strings.Builder
	for i, p := range parts {
		if i > 0 {
			p = "; " + p
		}
		if b.Len()+len(p)+len(more(len(parts)-i-1)) <= MaxMessage {
			b.WriteString(p)
			continue
		}
		if i > 0 {
			return b.String() + more(len(parts)-i)
		}
		// Not even the first fits: cut it.
		tail := "…" + more(len(parts)-1)
		cut := MaxMessage - len(tail)
		for cut > 0 && !utf8.RuneStart(p[cut]) {
			cut--
		}
		return p[:cut] + tail
	}
	return b.String()
}

// leaves are the messages of the errors err joins, depth first.
func leaves(err error) []string {
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return []string{err.Error()}
	}
	var out []string
	for _, e := range j.Unwrap() {
		if e != nil {
			out = append(out, leaves(e)...)
		}
	}
	return out
}
