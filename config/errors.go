package config

import (
	"fmt"
	"strings"
)

// Problem is one thing wrong with a configuration.
type Problem struct {
	// File is the configuration file's name, or, for a value that came
	// from an override, the override itself: "$KEYWAY_LISTEN" for an
	// environment variable, "--listen" for a flag, "--set" for WithSet.
	File string
	// Line and Column locate the value in File, 1-based. Both are 0 when
	// there is no position: an override, a problem with the whole file, or
	// a default value whose key (and every parent key) is absent.
	Line, Column int
	// Path is the YAML path of the key, e.g. "replica_sets[0].timeouts.connect";
	// empty for a problem with the whole file (empty, not YAML, ...).
	Path string
	// Message says what is wrong and, where it can, how to fix it.
	Message string
}

// String formats the problem as "FILE:LINE: PATH: message", leaving out
// the line when it is 0 and the path when it is empty.
func (p Problem) String() string {
	var b strings.Builder
	b.WriteString(p.File)
	if p.Line > 0 {
		fmt.Fprintf(&b, ":%d", p.Line)
	}
	b.WriteString(": ")
	if p.Path != "" {
		b.WriteString(p.Path)
		b.WriteString(": ")
	}
	b.WriteString(p.Message)
	return b.String()
}

// Error is every problem found while loading a configuration, in file
// order (problems from the file first, then from the environment, then from
// flags). Load returns it as a *Error; use errors.As to get the list.
type Error struct {
	Problems []Problem
}

// Error prints one problem per line, as Problem.String does.
func (e *Error) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}
