package server_test

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/inferencecache/operator/internal/kvindex/server"
)

// TestHTTPServerBoundsSlowClients: the index's HTTP servers time out a
// request body that never arrives (issue 25: the API had only a header
// timeout, and 50 slow-body connections stayed open). The server is
// NewHTTPServer's, with its read timeout shortened for the test.
func TestHTTPServerBoundsSlowClients(t *testing.T) {
	srv := server.NewHTTPServer("", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := bufio.NewReader(r.Body).ReadString('}'); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
		}
	}))
	if srv.ReadTimeout == 0 || srv.WriteTimeout == 0 || srv.IdleTimeout == 0 || srv.MaxHeaderBytes == 0 {
		t.Fatalf("NewHTTPServer leaves a limit unset: %+v", srv)
	}
	srv.ReadTimeout = 200 * time.Millisecond
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Close()

	c, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/score HTTP/1.1\r\nHost: index\r\nContent-Length: 1000\r\n\r\n{")
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second)) // only keeps a broken server from hanging the test
	line, err := bufio.NewReader(c).ReadString('\n')
	if err == nil && !strings.HasPrefix(line, "HTTP/1.1 400") {
		t.Fatalf("a body that never arrives was answered %q", line)
	}
	if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the server kept a connection whose body never arrived")
	}
}
