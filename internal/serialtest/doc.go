// Package serialtest keeps Spillway's heavy end-to-end tests from running
// at the same time as each other.
//
// `go test ./...` runs the test binaries of several packages at once (as
// many as GOMAXPROCS). The end-to-end tests that put a burst of CPU-bound
// geometry through a real broker against a scaled-down redelivery deadline
// (router's TestHeavyBurstRebalance, the demo's TestScenario) calibrate the
// work to what this machine does; when two of them overlap, each runs on
// half the cores it calibrated for, and a deadline the code under test
// keeps becomes one the machine cannot. [Exclusive] takes a lock shared by
// every test binary on the machine, so such tests take turns while the
// lighter tests of other packages go on.
package serialtest
