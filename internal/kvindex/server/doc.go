// Package server is the index's transports: the gRPC Ingest and Query
// services, the HTTP/JSON query API (Mooncake-shaped and protobuf JSON)
// and the TokenReview authenticator, over a kvindex.Index.
package server
