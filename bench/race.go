//go:build race

package main

// raceEnabled is true in a -race build: the smoke test then builds keyway
// with -race too, reusing the packages `go test -race ./...` compiled.
const raceEnabled = true
