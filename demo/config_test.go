package demo

import (
	"bytes"
	"os"
	"testing"
)

// examples/demo.yaml is what `keyway demo` runs: the embedded default,
// byte for byte.
func TestExampleIsTheEmbeddedConfig(t *testing.T) {
	b, err := os.ReadFile("../examples/demo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, ConfigYAML) {
		t.Fatal("examples/demo.yaml differs from demo/demo.yaml, the configuration keyway demo runs: cp demo/demo.yaml examples/demo.yaml")
	}
}
