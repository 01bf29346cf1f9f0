package admin_test

import (
	"net"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
)

// TestCheckAddr: what outboxd check says of the admin address, without
// serving: it can be bound, it is loopback or not, the hosts are names.
func TestCheckAddr(t *testing.T) {
	t.Parallel()
	if bound, loopback, err := admin.CheckAddr("127.0.0.1:0", nil); err != nil || !loopback || !strings.HasPrefix(bound, "127.0.0.1:") {
		t.Errorf("127.0.0.1:0: %q %v %v, want a loopback address bound", bound, loopback, err)
	}
	if _, loopback, err := admin.CheckAddr("0.0.0.0:0", nil); err != nil || loopback {
		t.Errorf("0.0.0.0:0: loopback %v, %v; want every interface, not loopback", loopback, err)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	if _, _, err := admin.CheckAddr(taken.Addr().String(), nil); err == nil || !strings.Contains(err.Error(), "--admin-addr") {
		t.Errorf("an address in use: %v, want an error naming --admin-addr", err)
	}
	if _, _, err := admin.CheckAddr("127.0.0.1:0", []string{"http://relay-1/"}); err == nil || !strings.Contains(err.Error(), "--admin-host") {
		t.Errorf("a URL as --admin-host: %v, want an error naming --admin-host", err)
	}
	// The address is free again for New.
	bound, _, err := admin.CheckAddr("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", bound)
	if err != nil {
		t.Fatalf("%s not released: %v", bound, err)
	}
	ln.Close()
}
