# Spillway — the two commands a newcomer needs are `make demo` and `make test`.
GO       ?= go
TIMEOUT  ?= 14m
FUZZTIME ?= 15s
BENCH    ?= .
COUNT    ?= 6

.PHONY: all test test-short demo demo-memory bench lint fuzz deps tidy

all: lint test

# deps installs what the tests need that Go modules do not bring:
# Debian's redis-server (the Redis Streams tests run against a real server).
deps:
	@bash .ci/deps.sh
	@$(GO) mod download

test: deps
	$(GO) test -race -timeout $(TIMEOUT) ./...

test-short:
	$(GO) test -short -timeout $(TIMEOUT) ./...

# The main job: real geometry through a budgeted router on an embedded Kafka.
demo:
	$(GO) run ./examples/kafka

demo-memory:
	$(GO) run ./examples/memory

# Benchmarks with their baselines in the same run (see docs/benchmarks.md).
bench:
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -count $(COUNT) ./... | tee bench.out

lint:
	$(GO) vet ./...
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) tool staticcheck ./...

# Short runs of every native fuzz test; FUZZTIME per target.
fuzz:
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; \
	    $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; \
	done

tidy:
	$(GO) mod tidy
