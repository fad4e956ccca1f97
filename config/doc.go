// Package config loads keyway's YAML configuration file.
//
// It owns no settings of its own: every section is a component's Config type
// (proxy.Config at the top level, admin.Config under "admin",
// logging.Config under "log"), each with its DefaultConfig() and Validate().
// This package only reads, aggregates and reports:
//
//  1. Start from [Default]. Every element of a list starts from its own
//     defaults as well: each replica_sets[i] from proxy.DefaultSetConfig()
//     and each static[j] from proxy.DefaultStaticReplica() (see newDefault).
//  2. Decode the file strictly, walking the yaml.Node tree against the
//     struct types by their yaml tags: unknown keys (with a "did you mean"
//     hint), duplicate keys, an empty file, a second document, values of
//     the wrong type and bare numbers where a duration is expected are
//     errors.
//  3. Apply environment overrides, KEYWAY_<PATH> for every scalar key that
//     is not inside a list (KEYWAY_LISTEN, KEYWAY_SERVER_MAX_CONNS, ...).
//  4. Apply explicit overrides ([WithSet], [WithFlag]), which the command
//     line uses for its flags.
//  5. Call [Config.Validate], which calls every section's Validate(), and
//     map each error's YAML path back to the line that set the value.
//
// So the precedence is defaults < file < environment < flags. Every
// problem found on the way is reported at once, as an [*Error]; each
// [Problem] names the file (or the environment variable, or the flag), the
// line and the YAML path.
//
// The decoder is generic: a new section is one more field in [Config] with
// a yaml tag, and a new list element type with non-zero defaults is one more
// case in newDefault. Supported field types are structs, slices, strings, booleans, integers, floats, time.Duration and any type whose
// pointer implements encoding.TextUnmarshaler (such as proxy.ByteSize).
//
// [Describe] lists every key with its type, default and environment
// variable; the reference tables of docs/configuration.md are generated from
// it (go test ./config -run TestDocs -update) and a test keeps them in step.
package config
