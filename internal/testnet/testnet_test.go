package testnet

import (
	"errors"
	"net"
	"syscall"
	"testing"
)

func TestRefusedAddr(t *testing.T) {
	addr := RefusedAddr(t)
	for range 3 {
		_, err := net.Dial("tcp", addr)
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("dial %s: %v, want connection refused", addr, err)
		}
	}
	if _, err := net.Listen("tcp", addr); err == nil {
		t.Fatal("another socket could listen on the reserved port")
	}
}
