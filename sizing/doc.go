// Package sizing answers one question: how many vertices the budget of a
// consumer process should admit at once.
//
// Two limits bound that number. The memory bound is how many in-flight
// vertices the memory one process has for geometry can hold; the deadline
// bound is how many vertices the handlers drain within the broker's
// redelivery deadline, with headroom. The budget is the smaller of the two,
// and which one binds decides what raises it: more memory helps only when
// memory binds, a faster handler only when the deadline does.
//
// Offline, a [Sample] of real payloads (from [ReadSample] or [NewSample])
// is measured with [MeasureBytesPerVertex] and, with the real handler, with
// [MeasureThroughput], which also reports how much more the slow vertices
// of the mix cost than the average one (the spread). [Recommend] turns
// those measurements and the deployment ([Inputs]: memory, processes,
// prefetch, deadline) into [Bounds]: both bounds, the budget and the bound
// that binds. They also carry the solo limit: one message runs on one
// core, so the largest message that finishes alone inside the deadline's
// headroom is a single core's deadline bound, whatever the budget; a
// bigger message needs a faster handler or another consumer. The spillway
// tool's size command does all of this from the command line.
//
// Online, an [AutoSizer] ([New]) times the handler calls that run through
// its middleware and keeps a [Resizable] budget at the deadline bound the
// measured speed gives, as the traffic mix drifts, under a fixed memory
// bound and a guard against the slowest calls; [AutoSizer.Bounds] reports
// what it computed. Behind a budget middleware it measures the charge the
// budget admitted the message with, which the middleware passes down in
// the message's context ([cost.AdmittedFromCtx]), so a message is priced
// once; outside one it reads the message's vertex_count. A vertex_count
// above the capacity is never a sample, so a forged one cannot skew it.
//
// Package sizing reads message costs through package cost; cost does not
// depend on sizing. See docs/sizing.md for the method and its reasoning.
package sizing
