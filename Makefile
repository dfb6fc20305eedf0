# inferencecache operator. `make demo` runs it on a local control plane built
# from the Go module proxy; `make test` runs every test suite against it.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c

CONTROLLER_GEN := go tool controller-gen
# test/tools/install.sh builds whichever control-plane binaries are missing
# (kube-apiserver, etcd, kubectl, kube-controller-manager, kube-scheduler,
# kwok) into a per-user cache folder keyed by version, and prints the folder.
INSTALL_CONTROLPLANE := bash test/tools/install.sh
# test/tools/install-packages.sh installs the Debian packages the tests use as
# real peers (libzmq, redis-server, promtool, protoc), only those missing.
INSTALL_PACKAGES := bash test/tools/install-packages.sh

.PHONY: all
all: build

.PHONY: build
build: ## Build the manager, the kubectl-cachebackend CLI, the cache-index service and the kvevent-subscriber sidecar into bin/.
	go build -o bin/manager ./cmd/manager
	go build -o bin/kubectl-cachebackend ./cmd/kubectl-cachebackend
	go build -o bin/cache-index ./cmd/cache-index
	CGO_ENABLED=0 go build -o bin/kvevent-subscriber ./cmd/kvevent-subscriber

.PHONY: generate
generate: ## Generate deepcopy code.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...

# protoc from Debian (protobuf-compiler, see test/tools/install-packages.sh);
# the Go plugins are go.mod tools, so their versions are pinned there.
PROTOC ?= /usr/bin/protoc
PROTO_FILES := $(shell find proto -name '*.proto' | sort)

.PHONY: proto
proto: ## Generate the gRPC contract's Go code (internal/kvindexpb) from proto/.
	@mkdir -p bin/protoc-plugins
	go build -o bin/protoc-plugins/protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go
	go build -o bin/protoc-plugins/protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc
	PATH="$$PWD/bin/protoc-plugins:$$PATH" $(PROTOC) -I proto \
		--go_out=. --go_opt=module=github.com/inferencecache/operator \
		--go-grpc_out=. --go-grpc_opt=module=github.com/inferencecache/operator \
		$(PROTO_FILES)

.PHONY: manifests
manifests: ## Generate the CRD and RBAC manifests.
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=kustomize/base/crd
	$(CONTROLLER_GEN) rbac:roleName=inferencecache-operator paths=./internal/... output:rbac:artifacts:config=kustomize/base/rbac
	$(CONTROLLER_GEN) webhook paths=./internal/... output:webhook:artifacts:config=kustomize/base/webhook
	go run ./hack/apidoc

.PHONY: verify
verify: ## Fail on unformatted code, vet findings or drift in generated files.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	go vet ./...
	$(MAKE) generate manifests proto
	@if [ -n "$$(git status --porcelain -- api kustomize docs/reference internal/kvindexpb)" ]; then \
		echo "generated files drifted; run 'make generate manifests proto' and commit:"; \
		git status --porcelain -- api kustomize docs/reference internal/kvindexpb; git diff -- api kustomize docs/reference internal/kvindexpb | head -50; exit 1; fi

.PHONY: controlplane
controlplane: ## Build the local control-plane binaries (only those missing).
	@dir=$$($(INSTALL_CONTROLPLANE)); echo "control-plane binaries in $$dir"

.PHONY: packages
packages: ## Install the Debian packages the tests use as real peers (only those missing; needs root).
	$(INSTALL_PACKAGES)

.PHONY: test
test: packages verify ## Run unit, fuzz-seed, integration (kube-apiserver + etcd) and end-to-end (whole local cluster) tests.
	dir=$$($(INSTALL_CONTROLPLANE)); \
	KUBEBUILDER_ASSETS="$$dir" CONTROLPLANE_DIR="$$dir" go test -count=1 -timeout 30m ./...
	go test -run '^$$' -fuzz FuzzAdmit -fuzztime 15s ./internal/inject/
	go test -run '^$$' -fuzz FuzzDecode -fuzztime 10s ./internal/kvevent/wire/

.PHONY: test-unit
test-unit: ## Run the tests that need no control plane.
	go test -count=1 ./api/... ./internal/render/... ./internal/apply/... ./internal/inject/... ./internal/kvevent/... ./cmd/kvevent-subscriber/...

.PHONY: demo
demo: ## Start a local cluster, run the operator against it and apply examples/quickstart.
	dir=$$($(INSTALL_CONTROLPLANE)); \
	CONTROLPLANE_DIR="$$dir" go run ./test/cmd/localcluster demo

.PHONY: demo-stop
demo-stop: ## Stop the local cluster and operator that `make demo` started.
	go run ./test/cmd/localcluster stop

.PHONY: help
help:
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'
