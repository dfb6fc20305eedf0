package freeport

import (
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeListener is a listener that reports a fixed port.
type fakeListener struct {
	net.Listener
	port   int
	closed *int
}

func (l fakeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: l.port} }
func (l fakeListener) Close() error   { *l.closed++; return nil }

func TestTakeNeverRepeatsAPort(t *testing.T) {
	for _, tc := range []struct {
		name    string
		offered []int // what the kernel offers, bind after bind
		given   []int
		want    []int // ports handed out, one Take each
		wantErr bool
	}{
		{name: "kernel offers a new port each time", offered: []int{40001, 40002}, want: []int{40001, 40002}},
		{name: "kernel offers the closed port again", offered: []int{40001, 40001, 40002}, want: []int{40001, 40002}},
		{name: "ports handed out before are skipped", offered: []int{40001, 40002, 40003}, given: []int{40001, 40002}, want: []int{40003}},
		{name: "only repeats: an error, not a repeat", offered: []int{40001, 40001}, given: []int{40001}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			given := map[int]bool{}
			for _, p := range tc.given {
				given[p] = true
			}
			next, opened, closed := 0, 0, 0
			listen := func() (net.Listener, error) {
				p := tc.offered[len(tc.offered)-1]
				if next < len(tc.offered) {
					p = tc.offered[next]
				}
				next++
				opened++
				return fakeListener{port: p, closed: &closed}, nil
			}
			var got []int
			for range max(len(tc.want), 1) {
				p, err := take(listen, given)
				if tc.wantErr {
					require.Error(t, err)
					require.Equal(t, opened, closed, "every listener is closed")
					return
				}
				require.NoError(t, err)
				got = append(got, p)
			}
			require.Equal(t, tc.want, got)
			require.Equal(t, opened, closed, "every listener is closed")
		})
	}
}

func TestTakeHandsOutDistinctFreePorts(t *testing.T) {
	seen := map[int]bool{}
	for range 200 {
		p := MustTake(t)
		require.False(t, seen[p], "port %d handed out twice", p)
		seen[p] = true
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		require.NoError(t, err, "port %d is free", p)
		require.NoError(t, l.Close())
	}
}
