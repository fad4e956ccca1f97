package config_test

import (
	"errors"
	"fmt"

	"keyway/config"
)

func ExampleLoadBytes() {
	file := []byte(`
replica_sets:
  - name: orders
    timeouts: {conect: 2s}
    static:
      - {name: orders-0, addr: "127.0.0.1:9001"}
`)
	_, err := config.LoadBytes("proxy.yaml", file, config.WithEnv(nil), config.WithFlag("--log-level", "log.level", "verbose"))
	var ce *config.Error
	if errors.As(err, &ce) {
		for _, p := range ce.Problems {
			fmt.Printf("%s line %d: %s\n", p.File, p.Line, p.Path)
		}
	}
	// Output:
	// proxy.yaml line 4: replica_sets[0].timeouts.conect
	// --log-level line 0: log.level
}

func ExampleSummary() {
	file := []byte(`
replica_sets:
  - name: orders
    replicas: 3
    static:
      - {name: orders-0, addr: "127.0.0.1:9001"}
      - {name: orders-1, addr: "127.0.0.1:9002"}
      - {name: orders-2, addr: "127.0.0.1:9003"}
`)
	c, err := config.LoadBytes("proxy.yaml", file, config.WithEnv(nil), config.WithSet("admin.listen", ""))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(config.Summary(c))
	// Output:
	// ok: 1 replica set (orders: 3 replicas declared, 3 static), listen :8080, admin off
}
