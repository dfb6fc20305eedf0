package lmcacheproto_test

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferencecache/operator/internal/lmcacheproto"
)

// TestHealthRequestBytes: the header is struct "iiiiiiiii150s" with command
// 5 and the key padded with spaces (test/conformance holds the same bytes
// to LMCache's own ClientMetaMessage.serialize).
func TestHealthRequestBytes(t *testing.T) {
	b := lmcacheproto.HealthRequest()
	require.Len(t, b, 186)
	assert.Equal(t, []byte{5, 0, 0, 0}, b[:4])
	assert.Equal(t, make([]byte, 32), b[4:36], "length, fmt, dtype, location and shape are 0")
	assert.Equal(t, lmcacheproto.ProbeKey+strings.Repeat(" ", 150-len(lmcacheproto.ProbeKey)), string(b[36:]))
	assert.Len(t, strings.Split(lmcacheproto.ProbeKey, "@"), 5, "model@world_size@worker_id@chunk_hash@dtype")
}

// serve accepts one connection on a local listener and hands it to answer.
func serve(t *testing.T, answer func(net.Conn)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				answer(c)
			}()
		}
	}()
	return l.Addr().String()
}

func reply(code int32) []byte {
	b := make([]byte, lmcacheproto.ReplySize)
	binary.LittleEndian.PutUint32(b, uint32(code))
	return b
}

// responder reads a full header and answers code, as lmcache_server does.
func responder(code int32, answer []byte) func(net.Conn) {
	return func(c net.Conn) {
		h := make([]byte, lmcacheproto.HeaderSize)
		if _, err := io.ReadFull(c, h); err != nil {
			return
		}
		if binary.LittleEndian.Uint32(h) != uint32(lmcacheproto.CommandHealth) {
			return
		}
		if answer == nil {
			answer = reply(code)
		}
		_, _ = c.Write(answer)
	}
}

func health(t *testing.T, addr string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	return lmcacheproto.Health(ctx, conn)
}

func TestHealth(t *testing.T) {
	t.Run("a correct responder passes", func(t *testing.T) {
		require.NoError(t, health(t, serve(t, responder(lmcacheproto.CodeSuccess, nil))))
	})
	t.Run("a listener that accepts and says nothing fails at the deadline", func(t *testing.T) {
		start := time.Now()
		err := health(t, serve(t, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) }))
		require.Error(t, err)
		assert.ErrorIs(t, err, os.ErrDeadlineExceeded, "%v", err)
		assert.Less(t, time.Since(start), 2*time.Second)
	})
	t.Run("a listener that closes at once fails", func(t *testing.T) {
		err := health(t, serve(t, func(net.Conn) {}))
		require.Error(t, err)
		assert.Contains(t, err.Error(), "reading the reply to HEALTH")
	})
	t.Run("code FAIL fails", func(t *testing.T) {
		err := health(t, serve(t, responder(lmcacheproto.CodeFail, nil)))
		require.Error(t, err)
		assert.Contains(t, err.Error(), "code 400")
	})
	t.Run("a short reply fails", func(t *testing.T) {
		err := health(t, serve(t, responder(0, reply(lmcacheproto.CodeSuccess)[:20])))
		require.Error(t, err)
		assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	})
}

// TestProbeScriptCarriesTheRequest: the container probe sends the very
// bytes of HealthRequest (the conformance suite runs it).
func TestProbeScriptCarriesTheRequest(t *testing.T) {
	s := lmcacheproto.ProbeScript()
	assert.Contains(t, s, "bytes.fromhex('05"+strings.Repeat("0", 70)+"')+b'"+lmcacheproto.ProbeKey+"'.ljust(150)")
	assert.Contains(t, s, "sys.argv[1]", "the port is the script's argument")
	assert.NotContains(t, s, "\"", "the script is one shell-safe argument")
}
