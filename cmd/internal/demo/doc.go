// Package demo is Spillway's headline demonstration and benchmark harness:
// the same realistic spatial stream consumed by a plain Watermill consumer
// (message-count concurrency, no budget) and by the Spillway router (vertex
// budget with auto-sizing, revocation-aware admission, shedding and a retry
// gate), one after the other, on an embedded Kafka broker, with a second
// consumer joining mid-burst to force a rebalance.
//
// The pieces:
//
//   - [Generate] builds the stream from the repository's real geometry:
//     point pings of moving vehicles (entity-keyed, versioned, with a region
//     priority) on a sheddable positions topic, and parcel polygons plus a
//     burst of heavy multipolygons on a boundaries topic that is never shed.
//   - [Run] calibrates the reference handler on this machine, then runs each
//     consumer group on a fresh embedded cluster and records what happened.
//   - A [Recording] holds, per group, the time series (in-flight vertices,
//     budget, lag, heap) and the per-message facts (latency, duplicates,
//     redeliveries, evictions); [Recording.Summary] condenses it and
//     [WriteReport] renders a self-contained HTML report with SVG charts.
//   - [Sweep] measures goodput for fixed budgets and an auto-sized one.
//
// The command-line front end is "spillway demo" (cmd/spillway); docs/demo.md
// explains what the demo shows and how to read the report.
package demo

// The demo's Redis consumers may run on redis.addr "embedded".
import _ "github.com/spillway-go/spillway/embedded"
