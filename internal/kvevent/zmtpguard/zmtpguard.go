// Package zmtpguard bounds the ZeroMQ frames the KV-event sidecar reads
// from an engine before the ZeroMQ library allocates them.
//
// go-zeromq/zmq4 (v0.17.0, conn.go) allocates a frame's body with
// make([]byte, size) as soon as it has read the frame's header: a peer
// that sends a 9-byte header announcing 1 TiB ends the process before any
// limit of ours applies (issue 25). The transports registered here wrap
// the connection and read the ZMTP 3 stream as it passes: the 64-byte
// greeting, then frames of one flags byte, a size of 1 or 8 bytes
// (big-endian) and the body. A frame announced larger than MaxFrame
// fails the read, so the library closes the connection and dials again,
// holding nothing.
package zmtpguard

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"sync/atomic"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// DefaultMaxFrame is MaxFrame until SetMaxFrame: 32 MiB, the sidecar's
// default --queue-bytes (a larger batch could never be queued).
const DefaultMaxFrame = 32 << 20

var maxFrame atomic.Uint64

func init() {
	maxFrame.Store(DefaultMaxFrame)
	for scheme, network := range map[string]string{"tcp": "tcp", "ipc": "unix"} {
		if err := zmq4.RegisterTransport(Scheme(scheme), guarded{transport.New(network)}); err != nil {
			panic(err)
		}
	}
}

// SetMaxFrame sets the largest frame body the guarded transports let
// through (at least 1 KiB).
func SetMaxFrame(n uint64) { maxFrame.Store(max(n, 1<<10)) }

// MaxFrame is the largest frame body the guarded transports let through.
func MaxFrame() uint64 { return maxFrame.Load() }

// Scheme is the guarded transport's name for a zmq4 scheme (tcp, ipc).
func Scheme(s string) string { return "bounded-" + s }

// Endpoint rewrites a tcp:// or ipc:// endpoint to its guarded transport;
// others are returned as they are.
func Endpoint(ep string) string {
	for _, s := range []string{"tcp", "ipc"} {
		if rest, ok := strings.CutPrefix(ep, s+"://"); ok {
			return Scheme(s) + "://" + rest
		}
	}
	return ep
}

// ErrFrameTooLarge fails the read of a frame announced past MaxFrame.
type ErrFrameTooLarge struct{ Size, Max uint64 }

func (e *ErrFrameTooLarge) Error() string {
	return fmt.Sprintf("zmtpguard: the peer announced a ZeroMQ frame of %d bytes, more than the %d allowed", e.Size, e.Max)
}

// guarded is a transport whose dialled connections are checked (the
// sidecar only dials; Listen is the wrapped transport's, unchecked).
type guarded struct{ transport.Transport }

func (g guarded) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := g.Transport.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	return &Conn{Conn: c, max: MaxFrame()}, nil
}

// greetingSize is the ZMTP 3 greeting: signature, version, mechanism,
// as-server, filler.
const greetingSize = 64

// Conn is a connection whose incoming ZMTP stream is checked frame by
// frame.
type Conn struct {
	net.Conn
	max uint64

	greeting int    // greeting bytes still to pass
	header   []byte // the frame header read so far (flags, size bytes)
	body     uint64 // body bytes of the current frame still to pass
	err      error
}

// Read reads from the connection and fails once the stream announces a
// frame larger than the limit.
func (c *Conn) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.Conn.Read(p)
	if ferr := c.scan(p[:n]); ferr != nil {
		c.err = ferr
		_ = c.Close()
		return 0, ferr
	}
	return n, err
}

func (c *Conn) scan(b []byte) error {
	for len(b) > 0 {
		switch {
		case c.greeting < greetingSize:
			k := min(greetingSize-c.greeting, len(b))
			c.greeting += k
			b = b[k:]
		case c.body > 0:
			k := min(c.body, uint64(len(b)))
			c.body -= k
			b = b[k:]
		default:
			c.header = append(c.header, b[0])
			b = b[1:]
			want := 2 // flags and a one-byte size
			if c.header[0]&0x02 != 0 {
				want = 9 // flags and an eight-byte size (LONG)
			}
			if len(c.header) < want {
				continue
			}
			var size uint64
			if want == 2 {
				size = uint64(c.header[1])
			} else {
				size = binary.BigEndian.Uint64(c.header[1:9])
			}
			c.header = c.header[:0]
			if size > c.max {
				return &ErrFrameTooLarge{Size: size, Max: c.max}
			}
			c.body = size
		}
	}
	return nil
}
