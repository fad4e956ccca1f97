.PHONY: test test-all race vet bench demo build docker fuzz

# What `keyway version` and the keyway_build_info metric report. Override
# any of them: make build VERSION=v1.2.0. VERSION is the nearest tag (git
# describe), or "dev" before the first tag; COMMIT ends in -dirty when the
# tree has uncommitted changes to tracked files.
VERSION ?= $(shell git describe --tags --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell c=$$(git rev-parse HEAD 2>/dev/null) && { git diff --quiet HEAD 2>/dev/null || c=$$c-dirty; echo $$c; })
DATE    ?= $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
BIN     ?= bin/keyway
STAMP   := keyway/internal/buildinfo
LDFLAGS := -X $(STAMP).version=$(VERSION) -X $(STAMP).commit=$(COMMIT) -X $(STAMP).date=$(DATE)

test:            ## all tests (the README's test command)
	go test ./...
test-all:        ## every test, the slow scenarios too (KEYWAY_SLOW_TESTS=1; CI runs these)
	KEYWAY_SLOW_TESTS=1 go test -timeout 15m ./...
race:            ## all tests under the race detector, slow scenarios included, as CI runs them
	KEYWAY_SLOW_TESTS=1 go test -race -count=1 -timeout 15m ./...
vet:
	gofmt -l $$(git ls-files '*.go'); go vet ./...
bench:           ## hot-path micro-benchmarks
	go test -run XXX -bench . -benchmem ./balancer/ ./proxy/
# Every fuzz target, as package:Target, run one at a time for FUZZTIME each
# (go test can fuzz one target per run). Their seed corpora (f.Add and
# testdata/fuzz/) run as ordinary tests in `make test`.
# FUZZMINIMIZE bounds the minimisation of each new interesting input:
# with the default (60s) a target fed whole configuration files spends
# its budget minimising.
FUZZTIME ?= 5m
FUZZMINIMIZE ?= 5s
FUZZ_TARGETS := \
	./proxy:FuzzFrontEnd ./proxy:FuzzReplicaResponse ./proxy:FuzzHeadScan ./internal/jsonstr:FuzzAppendJSONString \
	./config:FuzzLoadBytes ./config:FuzzDiff \
	./balancer:FuzzHashPathSegment ./balancer:FuzzHashQuery ./balancer:FuzzKeySources \
	./membership:FuzzDecodeMeta ./membership:FuzzMetaRoundTrip ./membership:FuzzUserMessage
fuzz:            ## every fuzz target for FUZZTIME each (make fuzz FUZZTIME=1m); a crasher lands in testdata/fuzz/
	FUZZTIME=$(FUZZTIME) FUZZMINIMIZE=$(FUZZMINIMIZE) scripts/fuzz.sh $(FUZZ_TARGETS)
demo:
	go run ./cmd/keyway demo
build:           ## bin/keyway, one static binary, stamped with VERSION, COMMIT and DATE
	CGO_ENABLED=0 go build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/keyway
docker:          ## the image keyway:VERSION, stamped like build (the image has no .git to read)
	docker build --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) --build-arg DATE=$(DATE) -t keyway:$(VERSION) .
