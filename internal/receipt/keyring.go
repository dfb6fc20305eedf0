package receipt

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// Secret layout: data["key"] signs and verifies; data["previous"], when
// present, only verifies (the rotation grace period).
const (
	SecretKeyCurrent  = "key"
	SecretKeyPrevious = "previous"
	// DefaultSecretName is the receipt key Secret in the operator's namespace.
	DefaultSecretName = "inferencecache-receipt-key"
	refreshInterval   = 30 * time.Second
)

// KeyRing holds the receipt keys, read from one Secret in the operator's own
// namespace through an uncached reader (no Secret informer, so the
// operator reads no other Secret). It creates the Secret with a random key
// when it does not exist. Keys are never logged.
//
// The ring never holds its lock across an API call, and a caller waits
// for one only while the ring holds no key: keys due for a refresh are
// returned at once while one background read of the Secret replaces them
// (holding none, callers wait for the one read or their own context).
// After a failed read it backs off, doubling from Backoff up to Refresh,
// so that a missing permission or an unavailable API server costs one
// request per back-off period, not one per admission.
type KeyRing struct {
	Client    client.Client
	Reader    client.Reader
	Namespace string
	Name      string
	// Refresh is how long keys are used before the Secret is read again
	// (30 s when zero): a rotation takes effect within it.
	Refresh time.Duration
	// Backoff is the wait after a first failed read (1 s when zero).
	Backoff time.Duration
	// Now is the clock (time.Now when nil); tests move it.
	Now func() time.Time

	mu       sync.Mutex
	keys     []Key
	fetched  time.Time
	loading  chan struct{}
	lastErr  error
	failures int
	retryAt  time.Time
}

// Signing returns the key that signs new receipts.
func (k *KeyRing) Signing(ctx context.Context) (Key, error) {
	keys, err := k.Keys(ctx)
	if err != nil {
		return Key{}, err
	}
	return keys[0], nil
}

// Held returns the signing key the ring holds now, without any API call
// (and so without creating the Secret): what a dry-run admission uses.
func (k *KeyRing) Held() (Key, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.keys) == 0 {
		return Key{}, false
	}
	return k.keys[0], true
}

// ErrBackingOff wraps the last read error while the ring waits before
// reading the Secret again.
var ErrBackingOff = errors.New("receipt keys unavailable; backing off")

// Keys returns the current key first, then the previous one if any.
func (k *KeyRing) Keys(ctx context.Context) ([]Key, error) {
	for {
		k.mu.Lock()
		now := k.now()
		if len(k.keys) > 0 && now.Sub(k.fetched) < k.refresh() {
			keys := k.keys
			k.mu.Unlock()
			return keys, nil
		}
		if now.Before(k.retryAt) {
			keys, err := k.keys, k.lastErr
			k.mu.Unlock()
			if len(keys) > 0 {
				return keys, nil // keep serving with the last keys read
			}
			return nil, fmt.Errorf("%w: %w", ErrBackingOff, err)
		}
		if wait := k.loading; wait != nil {
			keys := k.keys
			k.mu.Unlock()
			if len(keys) > 0 {
				return keys, nil // another caller is refreshing them
			}
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		done := make(chan struct{})
		k.loading = done
		held := k.keys
		k.mu.Unlock()

		if len(held) > 0 {
			// Keys are held, only due for a refresh: use them and read
			// the Secret in the background, so that no caller (an
			// admission above all) waits on the API server or on the
			// client's rate limiter once the ring has keys.
			go func() {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), backgroundReadTimeout)
				defer cancel()
				_, _ = k.reload(rctx, done)
			}()
			return held, nil
		}
		return k.reload(ctx, done)
	}
}

// backgroundReadTimeout bounds a refresh no caller waits for.
const backgroundReadTimeout = 30 * time.Second

// reload reads the Secret (the caller set k.loading to done) and records
// the outcome: the keys read, or the failure and its back-off while the
// keys held, if any, stay in use.
func (k *KeyRing) reload(ctx context.Context, done chan struct{}) ([]Key, error) {
	keys, err := k.load(ctx)

	k.mu.Lock()
	defer k.mu.Unlock()
	k.loading = nil
	close(done)
	if err != nil {
		k.failures++
		k.lastErr = err
		k.retryAt = k.now().Add(k.backoff())
		if len(k.keys) > 0 {
			return k.keys, nil
		}
		return nil, err
	}
	k.keys, k.fetched, k.failures, k.lastErr, k.retryAt = keys, k.now(), 0, nil, time.Time{}
	return keys, nil
}

func (k *KeyRing) now() time.Time {
	if k.Now != nil {
		return k.Now()
	}
	return time.Now()
}

func (k *KeyRing) refresh() time.Duration {
	if k.Refresh > 0 {
		return k.Refresh
	}
	return refreshInterval
}

// backoff is Backoff doubled per consecutive failure, at most Refresh.
// Called with mu held.
func (k *KeyRing) backoff() time.Duration {
	d := k.Backoff
	if d <= 0 {
		d = time.Second
	}
	for i := 1; i < k.failures && d < k.refresh(); i++ {
		d *= 2
	}
	return min(d, k.refresh())
}

func (k *KeyRing) load(ctx context.Context) ([]Key, error) {
	s := &corev1.Secret{}
	err := k.Reader.Get(ctx, client.ObjectKey{Namespace: k.Namespace, Name: k.Name}, s)
	if apierrors.IsNotFound(err) {
		s, err = k.create(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("reading receipt key secret %s/%s: %w", k.Namespace, k.Name, err)
	}
	return KeysFromSecret(s)
}

// MinKeyLength is the shortest secret, in bytes, accepted as a receipt key.
const MinKeyLength = 16

// KeysFromSecret parses the receipt key Secret: data["key"] (at least
// MinKeyLength bytes) signs and verifies, data["previous"] (when it holds
// at least MinKeyLength bytes) only verifies. It is the one parser of the
// Secret, used by the operator and the CLI alike.
func KeysFromSecret(s *corev1.Secret) ([]Key, error) {
	cur := s.Data[SecretKeyCurrent]
	if len(cur) < MinKeyLength {
		return nil, fmt.Errorf("receipt key secret %s/%s: data[%q] must hold at least %d bytes", s.Namespace, s.Name, SecretKeyCurrent, MinKeyLength)
	}
	keys := []Key{NewKey(cur)}
	if prev := s.Data[SecretKeyPrevious]; len(prev) >= MinKeyLength {
		keys = append(keys, NewKey(prev))
	}
	return keys, nil
}

func (k *KeyRing) create(ctx context.Context) (*corev1.Secret, error) {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, err
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: k.Namespace, Name: k.Name,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "inferencecache-operator"},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{SecretKeyCurrent: secret},
	}
	err := k.Client.Create(ctx, s)
	if apierrors.IsAlreadyExists(err) {
		// Another replica created it first: use theirs.
		s = &corev1.Secret{}
		err = k.Reader.Get(ctx, client.ObjectKey{Namespace: k.Namespace, Name: k.Name}, s)
	}
	return s, err
}

// Start creates the Secret if it is missing, so that the first admission
// does not wait for it; failures are retried at each use. It implements
// manager.Runnable.
func (k *KeyRing) Start(ctx context.Context) error {
	if _, err := k.Keys(ctx); err != nil {
		log.FromContext(ctx).Error(err, "receipt keys not available yet; retrying on use")
	}
	<-ctx.Done()
	return nil
}
