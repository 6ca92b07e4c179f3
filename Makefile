# fleetcap — run `make help` for the targets.
SHELL := /bin/bash
GO    ?= go

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@grep -E '^[a-z][a-z-]*:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

.PHONY: run
run: ## run one worker on the embedded Redis (config.yaml)
	$(GO) run ./cmd/worker

.PHONY: deps
deps: ## install what the tests need (redis-server, redis-sentinel, chromium, promtool) when missing
	@scripts/install-deps.sh

.PHONY: test
# One package at a time (-p 1): the fleet tests time what worker processes
# do, and on two cores another package's tests running alongside slowed them
# past their limits.
test: deps ## run every test with the race detector (starts private redis-servers)
	$(GO) test -race -count=1 -p 1 -timeout 30m ./...

.PHONY: test-short
test-short: deps ## the tests without the slow fault tests
	$(GO) test -race -count=1 -p 1 -short ./...

.PHONY: fuzz
fuzz: ## run each fuzz test for FUZZTIME (default 10s)
	@scripts/fuzz.sh $${FUZZTIME:-10s}

.PHONY: bench
bench: deps ## print the SPEC §4 benchmark lines (SCENARIOS=S5,S9 for some; REDIS_ADDR=host:port, else a private redis-server)
	$(GO) run ./bench $${SCENARIOS:+-scenarios $$SCENARIOS}

.PHONY: lint
lint: ## gofmt, go mod tidy -diff, go vet and staticcheck
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) mod tidy -diff
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
