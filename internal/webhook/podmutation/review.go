package podmutation

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/inferencecache/operator/internal/inject"
)

// review is what the webhook reads of an AdmissionReview
// (admission.k8s.io/v1 or v1beta1, whose requests have the same fields):
// the request's identity and the pod, nothing else. It is read in one pass
// with github.com/go-json-experiment/json in the API server's way (names
// case-sensitive, no duplicate names, valid UTF-8); the members it does
// not name (userInfo, oldObject, options, …) are checked for syntax and
// passed over.
type review struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Request    *reviewRequest `json:"request"`
}

// reviewRequest is the part of an AdmissionRequest a decision reads.
type reviewRequest struct {
	UID       types.UID               `json:"uid"`
	Kind      metav1.GroupVersionKind `json:"kind"`
	Namespace string                  `json:"namespace"`
	Name      string                  `json:"name"`
	Operation admissionv1.Operation   `json:"operation"`
	DryRun    *bool                   `json:"dryRun"`
	// Object is the pod, as inject reads it (nil when absent or null).
	Object *inject.Object `json:"object"`
}

// Review answers the AdmissionReview in body with the AdmissionReview the
// API server expects back (same apiVersion, the request's UID). The request
// is read once (review); the pod is decided by the same code as Handle's.
//
// A body that is not an AdmissionReview with a request UID is an error (the
// guard answers 400 and the API server, failurePolicy Ignore, admits the
// pod unwired). A request that names its UID but cannot be read further
// (a field of the wrong type, a malformed pod) is answered allowed with a
// warning, as every other failure of the webhook is.
func (h *Handler) Review(ctx context.Context, body []byte) ([]byte, error) {
	var rv review
	err := jsonv2.Unmarshal(body, &rv)
	if rv.APIVersion != "admission.k8s.io/v1" && rv.APIVersion != "admission.k8s.io/v1beta1" {
		// The API server posts the version it was configured with
		// (admissionReviewVersions); an unreadable review has none.
		if err == nil {
			err = fmt.Errorf("unsupported AdmissionReview apiVersion %q", rv.APIVersion)
		}
		return nil, fmt.Errorf("reading the admission request: %w", err)
	}
	var uid types.UID
	if rv.Request != nil {
		uid = rv.Request.UID
	}
	if err != nil && uid == "" {
		// A read that stopped early may not have reached the UID yet.
		uid, _ = reviewUID(bytes.NewReader(body))
	}
	if uid == "" {
		if err == nil {
			err = errors.New("no request.uid")
		}
		return nil, fmt.Errorf("reading the admission request: %w", err)
	}
	ctx = log.IntoContext(ctx, admissionLog())
	var resp admission.Response
	switch {
	case err != nil:
		log.FromContext(ctx).Error(err, "reading the admission request; admitting the pod unchanged", "requestID", uid)
		resp = failOpen(inject.Object{}, "reading the admission request: "+err.Error())
	case rv.Kind != "AdmissionReview":
		return nil, fmt.Errorf("reading the admission request: kind %q is not AdmissionReview", rv.Kind)
	default:
		r := rv.Request
		in := admissionInput{UID: r.UID, Kind: r.Kind, Namespace: r.Namespace, Name: r.Name, Operation: r.Operation, DryRun: r.DryRun != nil && *r.DryRun}
		if r.Object != nil {
			in.Object, in.objectErr = r.Object.Bind(body)
		} else {
			in.objectErr = errors.New("the admission request has no object")
		}
		resp = h.admit(ctx, in)
	}
	return encodeReview(rv.APIVersion, resp, uid)
}

// admissionLog is the logger controller-runtime's webhook.Admission would
// give a handler: the manager's, named admission. The handler adds the pod
// and the request's UID on the lines it writes.
var admissionLog = sync.OnceValue(func() logr.Logger { return log.Log.WithName("admission") })

// encodeReview completes resp for the request uid and encodes it in an
// AdmissionReview of apiVersion, as controller-runtime's webhook.Admission
// completes and encodes a handler's response.
func encodeReview(apiVersion string, resp admission.Response, uid types.UID) ([]byte, error) {
	if err := resp.Complete(admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{UID: uid}}); err != nil {
		return nil, fmt.Errorf("encoding the admission response: %w", err)
	}
	ar := admissionv1.AdmissionReview{Response: &resp.AdmissionResponse}
	ar.APIVersion, ar.Kind = apiVersion, "AdmissionReview"
	var b bytes.Buffer
	if err := json.NewEncoder(&b).Encode(ar); err != nil {
		return nil, fmt.Errorf("encoding the admission response: %w", err)
	}
	return b.Bytes(), nil
}

// reviewUID reads an AdmissionReview only as far as request.uid, token by
// token: the API server writes the UID before the object (the large part),
// which is never read. The guard answers requests it does not decode
// (oversized, or no slot before the deadline) with it.
func reviewUID(r io.Reader) (types.UID, error) {
	dec := jsontext.NewDecoder(bufio.NewReaderSize(r, 4096))
	if err := enterObject(dec); err != nil {
		return "", err
	}
	inRequest := false
	for {
		name, err := dec.ReadToken()
		if err != nil {
			return "", err
		}
		if name.Kind() == '}' {
			return "", errors.New("no request.uid in the admission review")
		}
		switch n := name.String(); {
		case !inRequest && n == "request":
			if err := enterObject(dec); err != nil {
				return "", err
			}
			inRequest = true
		case inRequest && n == "uid":
			v, err := dec.ReadToken()
			if err != nil {
				return "", err
			}
			if v.Kind() != '"' {
				return "", errors.New("request.uid is not a string")
			}
			return types.UID(v.String()), nil
		default:
			if err := dec.SkipValue(); err != nil {
				return "", err
			}
		}
	}
}

func enterObject(dec *jsontext.Decoder) error {
	t, err := dec.ReadToken()
	if err != nil {
		return err
	}
	if t.Kind() != '{' {
		return fmt.Errorf("expected an object in the admission review, got %v", t.Kind())
	}
	return nil
}
