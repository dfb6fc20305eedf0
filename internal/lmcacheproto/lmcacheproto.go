// Package lmcacheproto speaks the one part of LMCache's server protocol the
// operator needs: the HEALTH request a managed lmcache_server answers, and
// its reply. The controller's functional probe (internal/controller) sends
// it over a connection to the Service, and the server container's readiness
// and liveness probes (internal/render) send the same bytes from the image's
// own Python (ProbeScript), so both gate on the very exchange.
//
// The wire format is LMCache's, lmcache/v1/protocol.py (LMCache 0.5.6, the
// version test/tools/python/tested-versions.txt names; the conformance
// suite, test/conformance, holds these bytes to LMCache's own
// ClientMetaMessage and to a running lmcache_server):
//
//   - the client header is struct "iiiiiiiii150s" (native order; every
//     platform LMCache ships for is little-endian): command (ClientCommand,
//     HEALTH = 5), length, fmt, dtype, location, shape[0..3], then the key,
//     150 bytes padded with spaces: 186 bytes in all;
//   - the server parses the key with lmcache.utils.parse_cache_key even for
//     HEALTH, and drops the connection on a key that does not parse
//     (model@world_size@worker_id@chunk_hash_hex@dtype), so ProbeKey is a
//     well-formed key no engine uses;
//   - the reply is struct "iiiiiiiii" (36 bytes): code (ServerReturnCode,
//     SUCCESS = 200, FAIL = 400), length, fmt, dtype, shape[0..3], location.
package lmcacheproto

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"strings"
)

// LMCache's ClientCommand and ServerReturnCode values used here.
const (
	// CommandHealth is ClientCommand.HEALTH.
	CommandHealth int32 = 5
	// CodeSuccess is ServerReturnCode.SUCCESS.
	CodeSuccess int32 = 200
	// CodeFail is ServerReturnCode.FAIL.
	CodeFail int32 = 400
)

// Sizes of the messages (ClientMetaMessage.packlength and
// ServerMetaMessage.packlength).
const (
	// MaxKeyLength is protocol.MAX_KEY_LENGTH.
	MaxKeyLength = 150
	// HeaderSize is the size of a client header: nine int32 and the key.
	HeaderSize = 4*9 + MaxKeyLength
	// ReplySize is the size of a server reply: nine int32.
	ReplySize = 4 * 9
)

// ProbeKey is the key of the HEALTH request: a cache-engine key LMCache
// parses (model "inferencecache-probe", world size 1, worker 0, chunk hash
// 0, dtype half) that names no model an engine serves.
const ProbeKey = "inferencecache-probe@1@0@0@half"

// HealthRequest returns the client header of a HEALTH request: command 5,
// every other field 0, ProbeKey padded with spaces to MaxKeyLength.
func HealthRequest() []byte {
	b := make([]byte, HeaderSize)
	binary.LittleEndian.PutUint32(b, uint32(CommandHealth))
	copy(b[4*9:], ProbeKey)
	copy(b[4*9+len(ProbeKey):], bytes.Repeat([]byte{' '}, MaxKeyLength-len(ProbeKey)))
	return b
}

// ReplyCode returns the status code of a server reply of ReplySize bytes.
func ReplyCode(reply []byte) int32 {
	return int32(binary.LittleEndian.Uint32(reply[:4])) //nolint:gosec // the wire field is an int32
}

// Health sends a HEALTH request on conn and reads the reply: nil only for a
// full reply with code CodeSuccess. The context's deadline, if any, bounds
// the exchange; a server that accepts the connection and says nothing
// fails when it passes.
func Health(ctx context.Context, conn net.Conn) error {
	if dl, ok := ctx.Deadline(); ok {
		if err := conn.SetDeadline(dl); err != nil {
			return fmt.Errorf("setting the deadline: %w", err)
		}
	}
	if _, err := conn.Write(HealthRequest()); err != nil {
		return fmt.Errorf("sending HEALTH: %w", err)
	}
	reply := make([]byte, ReplySize)
	if _, err := io.ReadFull(conn, reply); err != nil {
		return fmt.Errorf("reading the reply to HEALTH (%d bytes): %w", ReplySize, err)
	}
	if code := ReplyCode(reply); code != CodeSuccess {
		return fmt.Errorf("HEALTH answered with code %d, not %d", code, CodeSuccess)
	}
	return nil
}

// ProbeTimeoutSeconds bounds each socket operation of ProbeScript; the
// container probes' timeoutSeconds is above it.
const ProbeTimeoutSeconds = 3

// ProbeScript is the Python program of the server container's exec probes,
// run as `python3 -c <ProbeScript()> <port>`: it connects to
// 127.0.0.1:<port>, sends HealthRequest's bytes and exits 0 only when the
// reply's code is CodeSuccess; otherwise it exits 1 with the reason. It
// needs nothing but the standard library (no torch import: it starts in
// tens of milliseconds).
func ProbeScript() string {
	// The nine integers in hex, then the key, which Python pads as the
	// request does (bytes.ljust pads with spaces).
	req := HealthRequest()
	return strings.Join([]string{
		"import socket,sys",
		"try:",
		fmt.Sprintf(" s=socket.create_connection(('127.0.0.1',int(sys.argv[1])),timeout=%d)", ProbeTimeoutSeconds),
		fmt.Sprintf(" s.sendall(bytes.fromhex('%s')+b'%s'.ljust(%d))", hex.EncodeToString(req[:4*9]), bytes.TrimRight(req[4*9:], " "), MaxKeyLength),
		" r=b''",
		fmt.Sprintf(" while len(r)<%d:", ReplySize),
		fmt.Sprintf("  b=s.recv(%d-len(r))", ReplySize),
		"  if not b:raise EOFError('connection closed before the reply')",
		"  r+=b",
		"except Exception as e:sys.exit('lmcache_server HEALTH: %r'%e)",
		"c=int.from_bytes(r[:4],'little',signed=True)",
		fmt.Sprintf("sys.exit(0 if c==%d else 'lmcache_server HEALTH: code %%d'%%c)", CodeSuccess),
	}, "\n")
}
