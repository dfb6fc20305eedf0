// Package freeport hands out TCP ports on 127.0.0.1 to tests that start a
// server process on a port they name. A port is one that was free a moment
// ago and that this process has not handed out before: the kernel may give
// the same ephemeral port to two bind(0) calls in a row once the first
// listener is closed, and a test that names two ports for one server (say
// gRPC and probes) must never get the same one twice. Another process may
// still take a port between the check and the server's bind; that race is
// the one left.
package freeport

import (
	"fmt"
	"net"
	"sync"
	"testing"
)

var (
	mu    sync.Mutex
	given = map[int]bool{}
)

// tries bounds the bind(0) calls one Take makes while the kernel keeps
// offering ports this process has already handed out.
const tries = 64

// Take returns a port free on 127.0.0.1 a moment ago and new to this
// process.
func Take() (int, error) {
	mu.Lock()
	defer mu.Unlock()
	return take(listen, given)
}

// TakeN is n ports from Take.
func TakeN(n int) ([]int, error) {
	ports := make([]int, n)
	for i := range ports {
		p, err := Take()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	return ports, nil
}

// MustTake is Take that fails the test on error.
func MustTake(t testing.TB) int {
	t.Helper()
	p, err := Take()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func listen() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }

// take binds port 0 until the kernel offers a port not in given, holding
// every listener until it returns so that the kernel cannot offer a held
// port again.
func take(listen func() (net.Listener, error), given map[int]bool) (int, error) {
	var held []net.Listener
	defer func() {
		for _, l := range held {
			_ = l.Close()
		}
	}()
	for range tries {
		l, err := listen()
		if err != nil {
			return 0, fmt.Errorf("free port: %w", err)
		}
		held = append(held, l)
		p := l.Addr().(*net.TCPAddr).Port
		if !given[p] {
			given[p] = true
			return p, nil
		}
	}
	return 0, fmt.Errorf("free port: %d binds offered only ports this process has handed out already", tries)
}
