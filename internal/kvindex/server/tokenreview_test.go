package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/inferencecache/operator/internal/kvindex/server"
)

// authenticator reviews with a fakeReviewer that knows "router-a", on a
// clock that moves only when told.
func authenticator(qps float64) (*server.TokenReviewAuthenticator, *fakeReviewer, *clock) {
	r := &fakeReviewer{users: map[string]string{"router-a": "system:serviceaccount:team-a:router"}}
	c := &clock{now: time.Unix(1_800_000_000, 0)}
	return &server.TokenReviewAuthenticator{Reviewer: r, Audiences: []string{audience}, CacheTTL: time.Minute, Now: c.Now, ReviewsPerSecond: qps}, r, c
}

// TestJunkTokensKeepVerdicts: distinct junk tokens (issue 25: at 4,096
// cached verdicts the whole cache was dropped) never evict a legitimate
// caller's verdict: after 10,000 of them, the router's token is answered
// from the cache.
func TestJunkTokensKeepVerdicts(t *testing.T) {
	a, r, _ := authenticator(1e9)
	ctx := context.Background()
	if _, err := a.Authenticate(ctx, jwt("router-a")); err != nil {
		t.Fatal(err)
	}
	for i := range 10_000 {
		if _, err := a.Authenticate(ctx, jwt(fmt.Sprint("junk-", i))); err == nil {
			t.Fatal("a junk token was accepted")
		}
	}
	calls := r.calls
	if c, err := a.Authenticate(ctx, jwt("router-a")); err != nil || c.ServiceAccount != "router" {
		t.Fatalf("the router after the junk: %+v, %v", c, err)
	}
	if r.calls != calls {
		t.Fatalf("the router's token was reviewed again after 10,000 junk tokens (%d reviews, then %d)", calls, r.calls)
	}
}

// TestTokensThatAreNotJWTsCostNoReview: a bearer token that is not shaped
// like a JWT is refused without asking the API server.
func TestTokensThatAreNotJWTsCostNoReview(t *testing.T) {
	a, r, _ := authenticator(1e9)
	for _, tok := range []string{"junk", "a.b", "a..c", "a.b.c.d", "a.b.c d", "eyJ.x+y.z", ".b.c", "a.b."} {
		if _, err := a.Authenticate(context.Background(), tok); err == nil {
			t.Errorf("%q accepted", tok)
		}
	}
	if r.calls != 0 {
		t.Fatalf("%d TokenReviews for tokens that are not JWTs, want 0", r.calls)
	}
}

// TestUncachedReviewsAreRateLimited: reviews of tokens in neither cache are
// limited to ReviewsPerSecond (a burst of as many, then that rate), counted
// in reviews on a clock the test moves; cached verdicts are not limited.
func TestUncachedReviewsAreRateLimited(t *testing.T) {
	a, r, c := authenticator(10)
	ctx := context.Background()
	if _, err := a.Authenticate(ctx, jwt("router-a")); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		_, _ = a.Authenticate(ctx, jwt(fmt.Sprint("junk-", i)))
	}
	if r.calls != 10 {
		t.Fatalf("%d TokenReviews for 101 new tokens at once, want the burst of 10", r.calls)
	}
	for range 50 {
		if _, err := a.Authenticate(ctx, jwt("router-a")); err != nil {
			t.Fatalf("the cached router refused while the limit holds: %v", err)
		}
	}
	c.Add(time.Second)
	for i := range 100 {
		_, _ = a.Authenticate(ctx, jwt(fmt.Sprint("more-junk-", i)))
	}
	if r.calls != 20 {
		t.Fatalf("%d TokenReviews after one more second, want 20", r.calls)
	}
}
