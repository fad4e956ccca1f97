package demo

import _ "embed"

// ConfigYAML is the configuration `keyway demo` runs when given no file
// (demo/demo.yaml): a proxy on 127.0.0.1:8080 (admin :9901, gossip :7946)
// for the replica set "orders" with three replicas.
//
//go:embed demo.yaml
var ConfigYAML []byte

// ConfigName names ConfigYAML in configuration errors.
const ConfigName = "demo.yaml (embedded)"
