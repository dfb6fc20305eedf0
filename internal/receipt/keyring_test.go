package receipt

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// stubReader serves the key Secret, or fails, and counts its calls; with
// block set, each Get waits for it to be closed.
type stubReader struct {
	gets  atomic.Int32
	fail  atomic.Bool
	block chan struct{}
}

func (r *stubReader) Get(ctx context.Context, _ client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	r.gets.Add(1)
	if r.block != nil {
		select {
		case <-r.block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if r.fail.Load() {
		return errors.New("forbidden")
	}
	obj.(*corev1.Secret).Data = map[string][]byte{SecretKeyCurrent: []byte("0123456789abcdef0123456789abcdef")}
	return nil
}

func (r *stubReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return errors.New("not used")
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// TestKeyRingBacksOffAfterAFailure: a failed read is not repeated by every
// caller; the next read waits for the back-off, which doubles.
func TestKeyRingBacksOffAfterAFailure(t *testing.T) {
	r := &stubReader{}
	r.fail.Store(true)
	c := &clock{t: time.Unix(1000, 0)}
	k := &KeyRing{Reader: r, Namespace: "ns", Name: "key", Backoff: time.Second, Refresh: 30 * time.Second, Now: c.now}
	ctx := context.Background()

	for range 10 {
		_, err := k.Keys(ctx)
		require.Error(t, err)
	}
	assert.EqualValues(t, 1, r.gets.Load(), "ten admissions within the back-off read the Secret once")

	c.t = c.t.Add(1100 * time.Millisecond)
	_, err := k.Keys(ctx)
	require.Error(t, err)
	assert.EqualValues(t, 2, r.gets.Load())
	c.t = c.t.Add(1100 * time.Millisecond)
	_, err = k.Keys(ctx)
	assert.ErrorIs(t, err, ErrBackingOff, "the second back-off is two seconds")
	assert.EqualValues(t, 2, r.gets.Load())

	r.fail.Store(false)
	c.t = c.t.Add(time.Second)
	keys, err := k.Keys(ctx)
	require.NoError(t, err)
	assert.Len(t, keys, 1)
	assert.EqualValues(t, 3, r.gets.Load())
}

// TestKeyRingHoldsNoLockAcrossAPICalls: while one caller waits on a slow
// read of the Secret, another caller with keys held gets them at once.
func TestKeyRingHoldsNoLockAcrossAPICalls(t *testing.T) {
	k, r := staleRing(t)
	slow := make(chan error, 1)
	go func() { _, err := k.Keys(context.Background()); slow <- err }()
	for r.gets.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := k.Keys(ctx); done <- err }()
	select {
	case err := <-done:
		require.NoError(t, err, "served the held keys while the refresh is in flight")
	case <-ctx.Done():
		t.Fatal("Keys blocked behind another caller's API call")
	}
	assert.EqualValues(t, 2, r.gets.Load(), "one read in flight, not two")
	close(r.block)
	require.NoError(t, <-slow)
	_, held := k.Held()
	assert.True(t, held)
}

// TestKeyRingRefreshesInTheBackground: once keys are held, a caller never
// waits for the Secret: keys due for a refresh are returned at once and
// replaced by one background read, whose result the next caller sees.
func TestKeyRingRefreshesInTheBackground(t *testing.T) {
	k, r := staleRing(t)
	c := k.clock
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	for range 20 {
		keys, err := k.Keys(ctx)
		require.NoError(t, err, "the held keys, without waiting for the read")
		require.Len(t, keys, 1)
	}
	cancel() // the caller that started the refresh is gone; the read goes on
	for r.gets.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	close(r.block)
	require.Eventually(t, func() bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		return k.loading == nil && k.fetched.Equal(c.t)
	}, 5*time.Second, time.Millisecond, "the background read replaced the keys")
	assert.EqualValues(t, 2, r.gets.Load(), "twenty callers, one read")
	assert.NoError(t, k.lastErr)
}

// staleRing returns a ring that read its keys once and whose keys are now
// due for a refresh, with the reader's next Get blocked until r.block is
// closed.
func staleRing(t *testing.T) (*testRing, *stubReader) {
	r := &stubReader{}
	c := &clock{t: time.Unix(1000, 0)}
	k := &KeyRing{Reader: r, Namespace: "ns", Name: "key", Refresh: 30 * time.Second, Now: c.now}
	_, err := k.Keys(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 1, r.gets.Load())
	r.block = make(chan struct{})
	c.t = c.t.Add(time.Minute)
	return &testRing{KeyRing: k, clock: c}, r
}

type testRing struct {
	*KeyRing
	clock *clock
}
