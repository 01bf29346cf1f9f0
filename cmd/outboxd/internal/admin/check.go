package admin

import (
	"fmt"
	"net"
)

// CheckAddr refuses what New would refuse of addr and hosts (an address it
// cannot bind, a host that is not a name or host:port) without serving:
// it binds addr and lets it go at once. It returns the bound address and
// whether only this machine can reach it (a loopback address), for
// outboxd check and the relay's start check. The port is free again when
// it returns, so New may bind it; another process may take it between.
func CheckAddr(addr string, hosts []string) (bound string, loopback bool, err error) {
	if addr == "" {
		addr = DefaultAddr
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", false, fmt.Errorf("admin: listen on %s (flag --admin-addr): %w", addr, err)
	}
	defer ln.Close()
	if _, err := newHostCheck(ln.Addr(), hosts); err != nil {
		return "", false, err
	}
	tcp, ok := ln.Addr().(*net.TCPAddr)
	return ln.Addr().String(), ok && tcp.IP.IsLoopback(), nil
}
