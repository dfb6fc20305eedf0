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

# The version every binary prints with --version (internal/version), from
# the nearest tag; "dev" outside a git checkout.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/inferencecache/operator/internal/version.Version=$(VERSION)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
# Where `make push` publishes the images and what dist/install.yaml pins
# them under (by digest).
REGISTRY ?= ghcr.io/inferencecache
IMAGES_DIR := dist/images

.PHONY: all
all: build

.PHONY: build
build: ## Build the manager and the kubectl-cachebackend CLI into bin/.
	go build -ldflags "$(LDFLAGS)" -o bin/manager ./cmd/manager
	go build -ldflags "$(LDFLAGS)" -o bin/kubectl-cachebackend ./cmd/kubectl-cachebackend

.PHONY: image
image: ## Build OCI image layouts (linux/amd64, linux/arm64) of the manager and the runtime binaries into dist/images, without Docker.
	go run ./hack/image -out $(IMAGES_DIR) -version $(VERSION) -revision $(REVISION)

.PHONY: push
push: image ## Push the image layouts to $(REGISTRY)/<image>:$(VERSION) (registry credentials from ~/.docker/config.json).
	for d in $(IMAGES_DIR)/*/; do \
		name=$$(basename "$$d"); \
		go run github.com/google/go-containerregistry/cmd/crane@v0.22.1 push "$$d" "$(REGISTRY)/$$name:$(VERSION)"; \
	done

.PHONY: build-installer
build-installer: image ## Write dist/install.yaml (production overlay) and dist/install-dev.yaml, the manager image pinned by digest under $(REGISTRY).
	go run ./hack/installer -out dist -images $(IMAGES_DIR) -registry $(REGISTRY) -version $(VERSION)

.PHONY: generate
generate: ## Generate deepcopy code.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...

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
	$(MAKE) generate manifests
	@if [ -n "$$(git status --porcelain -- api kustomize docs/reference)" ]; then \
		echo "generated files drifted; run 'make generate manifests' and commit:"; \
		git status --porcelain -- api kustomize docs/reference; git diff -- api kustomize docs/reference | head -50; exit 1; fi

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
	# Test modules of their own, whose dependencies stay out of go.mod.
	cd test/promql && go test -count=1 ./...
	go test -run '^$$' -fuzz FuzzAdmit -fuzztime 15s ./internal/inject/

.PHONY: test-unit
test-unit: ## Run the tests that need no control plane.
	go test -count=1 ./api/... ./internal/render/... ./internal/apply/... ./internal/inject/...

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
