// Package podmutation serves the mutating Pod webhook: the guard (request
// size, concurrency, the request's deadline), the admission handler and its
// one reader of an AdmissionReview (Handler.Review), the CacheBackend index
// kept from the informer, and the webhook's metrics. The decision itself is
// internal/inject's AdmitObject, which this package calls and never re-implements.
package podmutation
