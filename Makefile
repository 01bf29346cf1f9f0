# Developer entry points. `make` (or `make help`) lists them.
#
# The integration suite runs against real PostgreSQL and Elasticsearch
# servers managed by scripts/services (state in the git-ignored .dev/).

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

# Extra flags for `go test`, e.g. make test TESTFLAGS='-run TestRelay -v'
TESTFLAGS ?=
# Packages to test, e.g. make test PKGS=./indexer/...
PKGS ?= ./...

.PHONY: help build services-up services-down services-status test test-compat test-cluster test-unit vet demo bench clean

help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# Stamped into the binary (outboxd version); a build without them falls
# back on the VCS revision the Go toolchain records. The Dockerfile builds
# the image's binary with this target too (CGO_ENABLED=0, VERSION and
# COMMIT from its build arguments); scripts/check-dockerfile holds it to that.
VERSION ?= $(shell git describe --always --dirty 2>/dev/null)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS = -X main.version=$(VERSION) -X main.commit=$(COMMIT)

build: ## Build bin/outboxd, stamped with git describe and the commit
	go build -ldflags '$(LDFLAGS)' -o bin/outboxd ./cmd/outboxd

services-up: ## Start local PostgreSQL + Elasticsearch (idempotent)
	scripts/services up

services-down: ## Stop the local servers started by services-up
	scripts/services down

services-status: ## Show whether the local servers are running, with URLs
	scripts/services status

test: ## Full suite (race detector) against real servers; starts them first
	scripts/services up
	@# Chromium only when a selected package has a browser test.
	@if go list -f '{{.Dir}}' $(PKGS) | (while read -r d; do grep -qsi chromium "$$d"/*_test.go && exit 0; done; exit 1); then scripts/install-chromium; fi
	eval "$$(scripts/services env)" && go test -race -count=1 -timeout 40m $(TESTFLAGS) $(PKGS)
	@# These stop and start Elasticsearch and PostgreSQL, so they run alone,
	@# after the rest, and only against the servers scripts/services manages.
	@if [[ -n "$${ELASTICSEARCH_URL:-}" && "$${ELASTICSEARCH_URL%/}" != "http://127.0.0.1:$${OUTBOXD_ES_PORT:-9200}" ]]; then \
		echo "ELASTICSEARCH_URL points at your own server: skipping the tests that restart the servers"; \
	elif [[ -n "$${DATABASE_URL:-}" && "$${DATABASE_URL}" != "postgres://postgres@127.0.0.1:$${OUTBOXD_PG_PORT:-54329}/outboxd?sslmode=disable" ]]; then \
		echo "DATABASE_URL points at your own server: skipping the tests that restart the servers"; \
	else eval "$$(scripts/services env)" && go test -race -count=1 -p 1 -timeout 20m -tags restart -run TestRestart ./indexer/ ./relay/ ./cmd/outboxd/... ./examples/...; fi

test-compat: ## sink, operator-tool and command tests on OpenSearch 2 and 3, Elasticsearch 9 and 8.0 (one server at a time; scripts/test-compat lists the packages)
	scripts/test-compat $(COMPAT_TARGETS)

# The distributed setups: a 3-node Elasticsearch cluster (its own state and
# ports, CLUSTER_ES_* below, apart from the single node's) and a streaming
# standby of the local PostgreSQL (port + 1). The tests kill nodes and fail
# PostgreSQL over (the failover test rebuilds the standby and restarts the
# primary when it ends), so they only ever run against servers
# scripts/services manages here.
CLUSTER_ES_PORT ?= 9250
CLUSTER_ES_TRANSPORT_PORT ?= 9500
CLUSTER_ENV = OUTBOXD_ES_NODES=3 OUTBOXD_PG_STANDBY=1 \
	OUTBOXD_ES_PORT=$(CLUSTER_ES_PORT) OUTBOXD_ES_TRANSPORT_PORT=$(CLUSTER_ES_TRANSPORT_PORT)

test-cluster: ## Node loss, PostgreSQL failover and multi-relay tests on a local ES cluster + PG standby
	@if [[ -n "$${DATABASE_URL:-}$${ELASTICSEARCH_URL:-}" ]]; then \
		echo "test-cluster starts its own servers and ignores DATABASE_URL/ELASTICSEARCH_URL"; fi
	unset DATABASE_URL ELASTICSEARCH_URL && export $(CLUSTER_ENV) && scripts/services up && \
		eval "$$(scripts/services env)" && go test -race -count=1 -timeout 30m -tags cluster -run 'TestCluster' -v $(TESTFLAGS) ./cmd/outboxd/

test-unit: ## Unit tests only, no servers needed
	OUTBOXD_UNIT_ONLY=1 go test -short -race $(TESTFLAGS) $(PKGS)

# gofmt is given the .go files outside hidden folders (.dev/ holds the
# servers' data, owned by other users) and testdata/ (which, like for go vet,
# may hold deliberately odd files).
vet: ## go vet + gofmt check, the README's mirrored docs, the Dockerfile's build (scripts/check-dockerfile)
	go vet ./...
	go vet -tags restart ./...
	scripts/check-docs
	scripts/check-dockerfile
	@# A merge's conflict markers left in any tracked file.
	@if git grep -nE '^(<<<<<<< |>>>>>>> |=======$$)' -- ':!*.lock' >/dev/null 2>&1; then echo "conflict markers:"; git grep -nE '^(<<<<<<< |>>>>>>> |=======$$)'; exit 1; fi
	@files="$$(find . \( -name '.?*' -o -name testdata \) -prune -o -type f -name '*.go' -print)"; \
	unformatted="$$(if [[ -n $$files ]]; then gofmt -l $$files; fi)"; \
	if [[ -n $$unformatted ]]; then echo "gofmt needed on:"; echo "$$unformatted"; exit 1; fi

demo: ## Start the servers, build bin/outboxd and bin/tutorials (examples/tutorials) and run scripts/demo
	scripts/services up
	eval "$$(scripts/services env)" && scripts/demo

bench: ## Run scripts/bench
	scripts/bench

clean: ## Remove build output (bin/)
	rm -rf bin/
