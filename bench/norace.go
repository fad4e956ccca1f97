//go:build !race

package main

// raceEnabled is true in a -race build (see race.go).
const raceEnabled = false
