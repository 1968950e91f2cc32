// Package scaling is the scaling-curve benchmark behind "spillway bench":
// it measures what consuming costs, for the Spillway router and for the
// bare upstream subscriber it wraps, as the work grows along four axes.
//
//   - broker: embedded Kafka (kfake, run as a child process of the
//     benchmark so that its CPU and heap are not the consumer's) and a real
//     redis-server (skipped, and said so, when it is not installed);
//   - parallelism: partitions per topic on Kafka, consumers per topic on
//     Redis Streams (1, 4, 12, 48 by default);
//   - handlers: router handlers, each consuming a topic of its own (1, 8);
//   - message cost: a one-vertex ping, a real county polygon (tens of
//     vertices) or a heavy multipolygon assembled from real polygons
//     (10,000 vertices by default), all from the repository's testdata;
//   - and, for Spillway, the vertex budget's size.
//
// Every run consumes a backlog published before it starts, with a handler
// that decodes the geometry and computes its area and centroid. It records
// messages and vertices per second, the process's CPU time (getrusage,
// user + system) per message, and the peak heap, over the window from the
// moment the last handler receives its first message to the last message
// handled. [Run] returns a [Report]: the table, the ratio of Spillway's
// CPU per message to the bare subscriber's in each cell, and the checks
// that this ratio does not grow with parallelism, handlers or budget size.
// [Report.WriteTable] and [Report.WriteChart] render it; docs/benchmarks.md
// ("Scaling curve") summarises a full run.
package scaling
