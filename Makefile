.PHONY: test race vet bench demo build
test:            ## all tests (the README's test command)
	go test ./...
race:            ## all tests under the race detector, as CI runs them
	go test -race -count=1 ./...
vet:
	gofmt -l $$(git ls-files '*.go'); go vet ./...
bench:           ## hot-path micro-benchmarks
	go test -run XXX -bench . -benchmem ./balancer/ ./proxy/
demo:
	go run ./cmd/keyway demo
build:
	go build -o bin/keyway ./cmd/keyway
