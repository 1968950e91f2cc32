# Spillway — the two commands a newcomer needs are `make demo` and `make test`.
GO       ?= go
TIMEOUT  ?= 14m
FUZZTIME ?= 15s
BENCH    ?= .
COUNT    ?= 6

.PHONY: all test test-short soak demo demo-memory bench bench-report bench-curve bench-autoscale lint fuzz deps tidy

# The repository's modules, tied together by go.work: the library at the
# root (what a user's go get brings in), the embedded brokers (kfake,
# miniredis), the CLI and demo, and the examples. Every target below runs
# over all of them from the root.
MODULES := . embedded cmd examples
PKGS    := ./... ./embedded/... ./cmd/... ./examples/...

all: lint test

# deps installs what the tests need that Go modules do not bring:
# Debian's redis-server (the Redis Streams tests run against a real server),
# chromium (the demo report's test), prometheus (promtool, for the alert
# rules' unit tests) and kcat (librdkafka's client, for the Kafka interop
# test).
deps:
	@bash .ci/deps.sh
	@for m in $(MODULES); do (cd $$m && $(GO) mod download); done

# The end-to-end scenarios that calibrate a scaled-down redelivery deadline
# to this machine (HEAVY) run after everything else, one package at a time:
# internal/serialtest keeps them from overlapping each other, but not from
# the other packages' tests, and a machine whose load rises mid-run misses
# a deadline the code under test keeps (CI at 19a70ba: TestScenario's
# Spillway group evicted while the router's race tests ran beside it).
HEAVY      := ^(TestScenario|TestHeavyBurstRebalance|TestHeavyBurstRebalanceKey|TestTinyCurve|TestAutoscaleQuick)$$
HEAVY_PKGS := ./router/ ./cmd/internal/demo/ ./cmd/internal/scaling/ ./cmd/spillway/

test: deps
	$(GO) test -race -timeout $(TIMEOUT) -skip '$(HEAVY)' $(PKGS)
	$(GO) test -race -timeout $(TIMEOUT) -p 1 -run '$(HEAVY)' $(HEAVY_PKGS)

test-short:
	$(GO) test -short -timeout $(TIMEOUT) $(PKGS)

# The soak (not part of make test): embedded Kafka and a real redis-server,
# real geometry at twice the consumers' measured capacity with poison and
# duplicates mixed in, a consumer process killed and restarted every minute;
# it prints the accounting and fails on any unexplained message
# (docs/benchmarks.md). SOAK sets the length of the load; the drain of the
# backlog after it takes about as long again. Both brokers run at once.
SOAK ?= 10m
soak: deps
	SPILLWAY_SOAK=$(SOAK) $(GO) test -run '^TestSoak$$' -count=1 -v -timeout 3h ./internal/crashtest/

# The headline demo: the same stream of real geometry on an embedded Kafka,
# consumed by a message-count consumer and then by a Spillway consumer, with a
# rebalance mid-burst; prints a summary and writes demo-report.html
# (docs/demo.md). Flags: make demo DEMO_FLAGS="--deadline 6s".
DEMO_FLAGS ?=
demo:
	$(GO) run ./cmd/spillway demo $(DEMO_FLAGS)

# The in-memory example (examples/README.md) on the repository's two samples.
demo-memory:
	$(GO) run ./examples/memory -data testdata/countries-land-10km.ndjson,testdata/us-counties-10m.ndjson

# Benchmarks with their baselines in the same run (see docs/benchmarks.md):
# the Go benchmarks into bench.out, then bench-report.
bench:
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -count $(COUNT) -timeout 30m $(PKGS) | tee bench.out
	@$(MAKE) --no-print-directory bench-report

# The rest of the results from bench.out: its benchstat summary
# (benchstat.out), the demo scenario's JSON summary and report
# (bench-demo.json, bench-demo-report.html) and the goodput sweep
# (bench-sweep.json).
BENCHSTAT ?= $(shell command -v benchstat 2>/dev/null || echo "$(GO) run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da")
bench-report:
	$(BENCHSTAT) bench.out | tee benchstat.out
	$(GO) run ./cmd/spillway demo --json --quiet --report bench-demo-report.html > bench-demo.json
	$(GO) run ./cmd/spillway demo --sweep --json --quiet > bench-sweep.json
	@echo "bench: bench.out benchstat.out bench-demo.json bench-demo-report.html bench-sweep.json"

# The scaling curve (not part of make test or make bench): spillway bench
# consumes a backlog of real geometry on embedded Kafka and a real
# redis-server (make deps installs it; without it Redis is skipped), with
# the Spillway router and with the bare upstream subscriber, over
# partitions/consumers, handlers, message cost and budget; prints the table
# and the verdict, writes docs/scaling-curve.json and docs/scaling-chart.svg
# (docs/benchmarks.md, "Scaling curve"). About half an hour on two cores;
# make bench-curve CURVE_FLAGS=--quick for a short one.
CURVE_FLAGS ?=
bench-curve:
	$(GO) run ./cmd/spillway bench --chart docs/scaling-chart.svg --results docs/scaling-curve.json $(CURVE_FLAGS)

# The fleet experiment (not part of make test or make bench): spillway
# bench autoscale runs real consumer processes on embedded Kafka and a
# real redis-server, scaled by drain time or by message lag, on a bursty
# heavy-tailed stream; prints the table and writes docs/autoscale-chart.svg
# (docs/scaling.md, "The fleet experiment"). About seven minutes on two
# cores; make bench-autoscale AUTOSCALE_FLAGS=--quick for half a minute.
AUTOSCALE_FLAGS ?=
bench-autoscale:
	$(GO) run ./cmd/spillway bench autoscale --chart docs/autoscale-chart.svg $(AUTOSCALE_FLAGS)

lint:
	$(GO) vet $(PKGS)
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) tool staticcheck $(PKGS)
	@for m in $(MODULES); do \
	  (cd $$m && GOWORK=off $(GO) mod tidy -diff >/dev/null) || { echo "go.mod of $$m is not tidy: run make tidy"; exit 1; }; \
	done

# Short runs of every native fuzz test; FUZZTIME per target.
fuzz:
	@for pkg in $$($(GO) list $(PKGS)); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; \
	    $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; \
	done

# Each module is tidied on its own (GOWORK=off): go.work is for working in
# the repository, a module's go.mod is what its users get.
tidy:
	@for m in $(MODULES); do (cd $$m && GOWORK=off $(GO) mod tidy) || exit 1; done
