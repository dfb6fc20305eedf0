// Package podmutation serves the mutating Pod webhook: the guard (request
// size, concurrency, the request's deadline), the shortcut that answers a
// request from its bytes, the admission handler, the CacheBackend index
// kept from the informer, and the webhook's metrics. The decision itself is
// internal/inject's Admit, which this package calls and never re-implements.
package podmutation
