package podmutation

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"
	"unicode/utf8"

	"github.com/go-logr/logr"
	"github.com/inferencecache/operator/internal/inject"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// Shortcut answers some admission requests from their bytes alone, before
// controller-runtime decodes them. The guard asks it first.
type Shortcut interface {
	// Shortcut returns the whole response body for body, or false when
	// the request must be served in full.
	Shortcut(ctx context.Context, body []byte) ([]byte, bool)
}

// Shortcut serves a pod CREATE from one validating pass over the request's
// bytes, with the very response the full path (controller-runtime's decode
// of the AdmissionReview, then Handle) writes for it:
//   - a pod no CacheBackend claims and that carries none of the
//     annotations the webhook strips is answered allowed, without a patch,
//     and the pod is never decoded;
//   - any other pod is decided by Handle's own code, given the pod's bytes,
//     the CacheBackend the index selected and the request's fields the pass
//     read, so that neither the AdmissionReview nor the pod's labels are
//     decoded a second time.
//
// The pass reads every field controller-runtime would decode and checks
// its type as the decode does. Anything it does not read with certainty
// (malformed JSON, a duplicated or case-variant key among those it reads,
// a field of an unexpected type, a response in the request, an index not
// synced yet) goes the full way. TestShortcutAnswersAsTheFullPath and
// FuzzShortcut hold it to the full path's answer.
func (h *Handler) Shortcut(ctx context.Context, body []byte) ([]byte, bool) {
	if h.Backends == nil || !h.Backends.Synced() {
		return nil, false
	}
	var r reviewHead
	if !r.read(body) || string(r.operation) != string(admissionv1.Create) || len(r.group) != 0 || string(r.version) != "v1" ||
		string(r.kind) != "Pod" || len(r.namespace) == 0 || r.object == nil {
		return nil, false
	}
	cb := h.Backends.Select(string(r.namespace), r.labels)
	if cb == nil && !r.stripped {
		out, ok := encodeReview(r.apiVersion, admission.Allowed(""), types.UID(r.uid))
		if !ok {
			return nil, false
		}
		if !r.dryRun {
			Decisions.WithLabelValues(string(inject.NoMatch), "").Inc()
		}
		return out, true
	}
	req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID:       types.UID(r.uid),
		Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		Namespace: string(r.namespace), Name: string(r.name),
		Operation: admissionv1.Create,
		Object:    runtime.RawExtension{Raw: r.object},
	}}
	if r.hasDryRun {
		dryRun := r.dryRun
		req.DryRun = &dryRun
	}
	resp := h.handle(log.IntoContext(ctx, admissionLog()), req, &selection{backend: cb, stripped: r.stripped})
	return encodeReview(r.apiVersion, resp, req.UID)
}

// admissionLog is the logger controller-runtime's webhook.Admission gives
// the handler (see requestLogger).
var admissionLog = sync.OnceValue(func() logr.Logger { return log.Log.WithName("admission") })

// encodeReview completes resp for the request uid and encodes it in an
// AdmissionReview of apiVersion, as controller-runtime's webhook.Admission
// completes and encodes its handler's response.
func encodeReview(apiVersion string, resp admission.Response, uid types.UID) ([]byte, bool) {
	if err := resp.Complete(admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{UID: uid}}); err != nil {
		return nil, false
	}
	ar := admissionv1.AdmissionReview{Response: &resp.AdmissionResponse}
	ar.APIVersion, ar.Kind = apiVersion, "AdmissionReview"
	var b bytes.Buffer
	if err := json.NewEncoder(&b).Encode(ar); err != nil {
		return nil, false
	}
	return b.Bytes(), true
}

// reviewHead is what Shortcut reads of an AdmissionReview.
type reviewHead struct {
	apiVersion                      string
	uid, operation, namespace, name []byte // slices of the request when not escaped
	group, version, kind            []byte // request.kind
	dryRun, hasDryRun               bool
	object                          []byte // request.object, when it is a JSON object
	labels                          map[string]string
	stripped                        bool // an annotation the webhook strips
}

// read scans body, which must be one valid JSON object, and fills r. It
// reports false for anything it does not read with certainty.
func (r *reviewHead) read(body []byte) bool {
	s := &scanner{b: body}
	s.ws()
	var kind string
	var request bool
	ok := s.fields([]string{"apiVersion", "kind", "request", "response"}, func(i int) bool {
		var ok bool
		switch i {
		case 0:
			r.apiVersion, ok = s.str()
		case 1:
			kind, ok = s.str()
		case 2:
			request, ok = true, r.request(s)
		}
		return ok // a response in a request goes the full way
	})
	s.ws()
	return ok && s.i == len(s.b) && kind == "AdmissionReview" && request &&
		(r.apiVersion == "admission.k8s.io/v1" || r.apiVersion == "admission.k8s.io/v1beta1")
}

// requestFields are the members of an AdmissionRequest (admission/v1);
// request reads the first seven and checks the type of the others.
var requestFields = []string{"uid", "operation", "namespace", "dryRun", "kind", "object", "name",
	"resource", "requestResource", "requestKind", "subResource", "requestSubResource", "userInfo", "oldObject", "options"}

func (r *reviewHead) request(s *scanner) bool {
	return s.want('{') && s.fields(requestFields, func(i int) bool {
		var ok bool
		switch i {
		case 0:
			r.uid, ok = s.value()
		case 1:
			r.operation, ok = s.value()
		case 2:
			r.namespace, ok = s.value()
		case 3:
			r.hasDryRun = true
			r.dryRun, ok = s.boolean()
		case 4:
			ok = s.members([]string{"group", "version", "kind"}, &r.group, &r.version, &r.kind)
		case 5:
			s.ws()
			start := s.i
			ok = s.want('{') && s.fields([]string{"metadata"}, func(int) bool {
				return s.null() || s.want('{') && r.metadata(s)
			})
			if ok {
				r.object = s.b[start:s.i]
			}
		case 6:
			r.name, ok = s.value()
		case 7, 8:
			ok = s.strings("group", "version", "resource")
		case 9:
			ok = s.strings("group", "version", "kind")
		case 10, 11:
			ok = s.optString()
		case 12:
			ok = s.null() || s.want('{') && s.fields([]string{"username", "uid", "groups", "extra"}, func(i int) bool {
				switch i {
				case 0, 1:
					return s.optString()
				case 2:
					return s.stringArray()
				}
				return s.null() || s.object(func([]byte) bool { return s.stringArray() })
			})
		default:
			ok = s.skip() // a RawExtension: any JSON value
		}
		return ok
	})
}

// members reads an object whose members named in names are strings,
// storing each in the slot of to at its index.
func (s *scanner) members(names []string, to ...*[]byte) bool {
	return s.want('{') && s.fields(names, func(i int) bool {
		var ok bool
		*to[i], ok = s.value()
		return ok
	})
}

// strings reads null or an object whose members named in names are
// strings or null, as a GroupVersionKind or GroupVersionResource decodes.
func (s *scanner) strings(names ...string) bool {
	return s.null() || s.want('{') && s.fields(names, func(int) bool { return s.optString() })
}

// optString reads a string or null.
func (s *scanner) optString() bool {
	if s.null() {
		return true
	}
	_, ok := s.value()
	return ok
}

// stringArray reads null or an array of strings and nulls.
func (s *scanner) stringArray() bool {
	return s.null() || s.want('[') && s.list(']', s.optString)
}

// metadata reads the pod's labels and whether it has an annotation the
// webhook strips.
func (r *reviewHead) metadata(s *scanner) bool {
	return s.fields([]string{"labels", "annotations"}, func(i int) bool {
		if s.null() {
			return true
		}
		return s.want('{') && s.object(func(k []byte) bool {
			v, ok := "", s.null()
			if !ok {
				if v, ok = s.str(); !ok {
					return false
				}
			}
			if i == 0 {
				r.label(string(k), v)
				return true
			}
			if inject.Stripped(string(k)) {
				r.stripped = true
			}
			return true
		})
	})
}

func (r *reviewHead) label(k, v string) {
	if r.labels == nil {
		r.labels = make(map[string]string, 8)
	}
	r.labels[k] = v
}

// variant is field's answer for a key that equals one of the names only
// when case is ignored (encoding/json's way of matching some of them).
const variant = -2

// field returns the index of key among names, variant, or -1.
func field(key []byte, names ...string) int {
	for i, n := range names {
		if string(key) == n {
			return i
		}
	}
	for _, n := range names {
		if bytes.EqualFold(key, []byte(n)) {
			return variant
		}
	}
	return -1
}

// fields reads an object, calling read with the index in names of each
// member named there (its value at s.i; read consumes it) and skipping the
// others. A name seen twice, or a key that is one of names only when case
// is ignored, fails the read.
func (s *scanner) fields(names []string, read func(i int) bool) bool {
	var seen uint64
	return s.object(func(key []byte) bool {
		i := field(key, names...)
		switch {
		case i == variant:
			return false
		case i < 0:
			return s.skip()
		case seen&(1<<i) != 0:
			return false
		}
		seen |= 1 << i
		return read(i)
	})
}

// scanner is a validating single-pass JSON reader: every value it passes
// over is checked against the JSON grammar, as encoding/json checks the
// whole input before decoding it.
type scanner struct {
	b     []byte
	i     int
	depth int
}

// maxDepth is encoding/json's nesting limit.
const maxDepth = 10000

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// want reports whether the next value starts with c, without consuming it.
func (s *scanner) want(c byte) bool {
	s.ws()
	return s.i < len(s.b) && s.b[s.i] == c
}

// object reads the object at s.i, calling field with each key and s at the
// start of its value; field consumes the value.
func (s *scanner) object(field func(key []byte) bool) bool {
	if !s.want('{') {
		return false
	}
	return s.list('}', func() bool {
		s.ws()
		key, ok := s.strBytes()
		if !ok {
			return false
		}
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return false
		}
		s.i++
		s.ws()
		return field(key)
	})
}

func (s *scanner) array() bool { return s.list(']', s.skip) }

// list reads the members of the object or array opened at s.i, up to its
// closing byte, calling item for each one.
func (s *scanner) list(closing byte, item func() bool) bool {
	if s.depth++; s.depth > maxDepth {
		return false
	}
	defer func() { s.depth-- }()
	s.i++
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == closing {
		s.i++
		return true
	}
	for {
		if !item() {
			return false
		}
		s.ws()
		if s.i >= len(s.b) {
			return false
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case closing:
			s.i++
			return true
		default:
			return false
		}
	}
}

// skip passes over one value.
func (s *scanner) skip() bool {
	s.ws()
	if s.i >= len(s.b) {
		return false
	}
	switch s.b[s.i] {
	case '"':
		_, _, ok := s.stringEnd()
		return ok
	case '{':
		return s.object(func([]byte) bool { return s.skip() })
	case '[':
		return s.array()
	case 't':
		return s.literal("true")
	case 'f':
		return s.literal("false")
	case 'n':
		return s.literal("null")
	default:
		return s.number()
	}
}

func (s *scanner) literal(l string) bool {
	if !bytes.HasPrefix(s.b[s.i:], []byte(l)) {
		return false
	}
	s.i += len(l)
	return true
}

// null consumes a null and reports whether there was one.
func (s *scanner) null() bool {
	s.ws()
	return bytes.HasPrefix(s.b[s.i:], []byte("null")) && s.literal("null")
}

// boolean reads true, false or null (false), as encoding/json stores them
// into a *bool.
func (s *scanner) boolean() (bool, bool) {
	s.ws()
	switch {
	case s.literal("true"):
		return true, true
	case s.literal("false"), s.literal("null"):
		return false, true
	}
	return false, false
}

func (s *scanner) number() bool {
	b, i := s.b, s.i
	digits := func() bool {
		start := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		return i > start
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case !digits():
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if !digits() {
			return false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if !digits() {
			return false
		}
	}
	s.i = i
	return true
}

// stringEnd passes over the string at s.i and returns its bytes with the
// quotes and whether it needs decoding (escapes or invalid UTF-8).
func (s *scanner) stringEnd() (raw []byte, decode bool, ok bool) {
	b := s.b
	if s.i >= len(b) || b[s.i] != '"' {
		return nil, false, false
	}
	for j := s.i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			raw = b[s.i : j+1]
			s.i = j + 1
			return raw, decode || !utf8.Valid(raw), true
		case c < 0x20:
			return nil, false, false
		case c == '\\':
			decode = true
			j++
			if j >= len(b) {
				return nil, false, false
			}
			switch b[j] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if j+4 >= len(b) {
					return nil, false, false
				}
				for _, h := range b[j+1 : j+5] {
					if !isHex(h) {
						return nil, false, false
					}
				}
				j += 4
			default:
				return nil, false, false
			}
		}
	}
	return nil, false, false
}

// strBytes reads a string and returns its value; without escapes it is a
// slice of the input.
func (s *scanner) strBytes() ([]byte, bool) {
	raw, decode, ok := s.stringEnd()
	if !ok {
		return nil, false
	}
	if !decode {
		return raw[1 : len(raw)-1], true
	}
	var v string
	if json.Unmarshal(raw, &v) != nil {
		return nil, false
	}
	return []byte(v), true
}

// str reads a string value (not null).
func (s *scanner) str() (string, bool) {
	v, ok := s.value()
	return string(v), ok
}

// value reads a string value (not null) without copying it when it has
// no escapes.
func (s *scanner) value() ([]byte, bool) {
	s.ws()
	return s.strBytes()
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}
