package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"keyway/admin"
	"keyway/internal/stacktest"
)

// keyway create and delete speak to the CLI's user: a definition's
// problems name the file and its line (the API names the request body), a
// set that exists is changed with the CLI's commands (the API says
// PATCH), and a refused delete names the replicas once.
func TestCLICreateDeleteMessages(t *testing.T) {
	t.Setenv(admin.TokenEnv, "s3cret")
	st := stacktest.StartOrders(t)
	t.Setenv("KEYWAY_ADMIN", st.Admin)
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}

	bad := write("users.json", "{\n  \"name\": \"users\",\n  \"replicas\": 0,\n  \"bogus\": 1\n}\n")
	_, _, err := keywayCLI(t, "create", "-f", bad)
	if err == nil || !strings.Contains(err.Error(), "\n  "+bad+":3: replicas: must be between 1 and 1000, got 0") ||
		!strings.Contains(err.Error(), "\n  "+bad+`:4: bogus: unknown key "bogus"`) || strings.Contains(err.Error(), "request body") {
		t.Errorf("create -f %s: %v\nwant each problem at %s:LINE", bad, err, bad)
	}
	short := write("short.json", "{\"name\": \"users\",")
	if _, _, err := keywayCLI(t, "create", "-f", short); err == nil || !strings.Contains(err.Error(), "\n  "+short+": the JSON ends early") {
		t.Errorf("create -f %s: %v", short, err)
	}

	dup := write("orders.json", `{"name": "orders", "replicas": 3}`)
	_, _, err = keywayCLI(t, "create", "-f", dup)
	if err == nil || !strings.Contains(err.Error(), `replica set already exists: "orders" (the configuration file defines it); change it with keyway scale, stop or start, or delete it first (keyway delete)`) ||
		strings.Contains(err.Error(), "PATCH") || exitCode(err) != exitRuntime {
		t.Errorf("create -f %s: %v (exit %d)", dup, err, exitCode(err))
	}

	_, _, err = keywayCLI(t, "delete", "--set", "orders")
	if err == nil {
		t.Fatal("delete of a running set: accepted")
	}
	msg := err.Error()
	if !strings.Contains(msg, `replica set "orders" still has replicas running or draining: orders-0 (static), orders-1 (static), orders-2 (static); stop the set first (keyway stop --set orders)`) ||
		strings.Count(msg, "orders-1") != 1 || strings.Contains(msg, "PATCH") || !strings.Contains(msg, "(HTTP 400)") {
		t.Errorf("delete of a running set:\n%s\nwant the replicas named once, and keyway stop", msg)
	}
}
