// Package cost turns spatial messages into admission charges.
//
// Spillway bounds concurrent work in vertices, not messages. The cost of a
// message travels in its envelope: the metadata key [MetadataKey]
// ("vertex_count") is stamped once, at ingest, by a publisher wrapped with
// [NewStampingPublisher], so consumers never have to parse geometry just to
// decide whether they can afford it. The stamping publisher counts every
// message of a Publish call before it modifies or publishes any of them; one
// payload it cannot count fails the whole call with [ErrUnstampable].
//
// The estimator of [NewEstimator] reads that key. A missing or malformed value is never
// treated as cheap: it is charged a high default (by convention the budget's
// whole capacity, [FullBudget]) and the returned [Charge] records where the
// number came from, so the cases can be counted and alerted on. Whatever
// the count, a message is charged at least one vertex per 64 bytes of
// payload, since decoding takes memory in proportion to the bytes; and a
// GeoJSON geometry is stamped at least its number of coordinate arrays, so
// one of empty polygons is charged for the polygons it builds.
//
// [Decode], [Vertices] and [CountPayload] read GeoJSON (Geometry, Feature,
// FeatureCollection), WKB, EWKB and hex-encoded WKB/EWKB payloads with
// go-geom and count stored coordinates. Binary input is checked structurally
// before go-geom sees it, so hostile payloads fail with [ErrMalformed] or
// [ErrTooLarge] instead of exhausting memory or the stack, and CountPayload
// counts binary input without building the geometry at all.
//
// How big the budget should be is package sizing's concern
// (github.com/spillway-go/spillway/sizing, docs/sizing.md).
package cost
