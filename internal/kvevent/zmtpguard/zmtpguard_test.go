package zmtpguard

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

func frame(flags byte, body []byte) []byte {
	if flags&0x02 != 0 {
		var size [8]byte
		binary.BigEndian.PutUint64(size[:], uint64(len(body)))
		return append(append([]byte{flags}, size[:]...), body...)
	}
	return append([]byte{flags, byte(len(body))}, body...)
}

// TestScan reads ZMTP streams cut at every byte: frames within the limit
// pass whatever the cut, a header announcing more fails as soon as its
// size is read.
func TestScan(t *testing.T) {
	greeting := bytes.Repeat([]byte{0}, greetingSize)
	huge := make([]byte, 9)
	huge[0] = 0x02
	binary.BigEndian.PutUint64(huge[1:], 1<<40)
	for _, tc := range []struct {
		name   string
		stream []byte
		want   uint64 // the size refused; 0: none
	}{
		{"short frames", bytes.Join([][]byte{greeting, frame(0x04, []byte("\x05READY")), frame(0x01, []byte("kv")), frame(0x00, bytes.Repeat([]byte{1}, 200))}, nil), 0},
		{"a long frame within the limit", bytes.Join([][]byte{greeting, frame(0x02, bytes.Repeat([]byte{2}, 1000))}, nil), 0},
		{"a short frame's size byte is at most 255", bytes.Join([][]byte{greeting, frame(0x00, bytes.Repeat([]byte{2}, 255))}, nil), 0},
		{"9 bytes announcing 1 TiB", append(append([]byte{}, greeting...), huge...), 1 << 40},
		{"after frames that pass", bytes.Join([][]byte{greeting, frame(0x01, []byte("kv")), huge}, nil), 1 << 40},
		{"a long frame past the limit", bytes.Join([][]byte{greeting, frame(0x02, bytes.Repeat([]byte{3}, 1025))}, nil), 1025},
	} {
		for cut := 1; cut <= len(tc.stream); cut++ {
			c := &Conn{max: 1024}
			var err error
			for b := tc.stream; len(b) > 0 && err == nil; {
				k := min(cut, len(b))
				err = c.scan(b[:k])
				b = b[k:]
			}
			var tooLarge *ErrFrameTooLarge
			switch {
			case tc.want == 0 && err != nil:
				t.Fatalf("%s, cut every %d bytes: %v", tc.name, cut, err)
			case tc.want != 0 && (!errors.As(err, &tooLarge) || tooLarge.Size != tc.want):
				t.Fatalf("%s, cut every %d bytes: %v, want a refusal of %d bytes", tc.name, cut, err, tc.want)
			}
		}
	}
}

// TestGuardedSubscriber: a zmq4 SUB dialing through the guarded transport
// receives a PUB's messages within the limit and drops the connection at
// one past it, before the library allocates it.
func TestGuardedSubscriber(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ep := fmt.Sprintf("tcp://%s", l.Addr())
	_ = l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pub := zmq4.NewPub(ctx)
	defer func() { _ = pub.Close() }()
	if err := pub.Listen(ep); err != nil {
		t.Fatal(err)
	}
	SetMaxFrame(4 << 10)
	defer SetMaxFrame(DefaultMaxFrame)
	sub := zmq4.NewSub(ctx)
	defer func() { _ = sub.Close() }()
	if err := sub.Dial(Endpoint(ep)); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	got := make(chan zmq4.Msg, 16)
	go func() {
		for {
			m, err := sub.Recv()
			if err != nil {
				close(got)
				return
			}
			got <- m
		}
	}()
	small := bytes.Repeat([]byte{1}, 1<<10)
	// The subscription reaches the PUB asynchronously: publish until one
	// arrives.
	deadline := time.After(10 * time.Second)
	for received := false; !received; {
		if err := pub.Send(zmq4.NewMsgFrom([]byte("kv"), small)); err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-got:
			if len(m.Frames) != 2 || !bytes.Equal(m.Frames[1], small) {
				t.Fatalf("received %d frames", len(m.Frames))
			}
			received = true
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatal("no message within the limit arrived")
		}
	}
	if err := pub.Send(zmq4.NewMsgFrom([]byte("kv"), bytes.Repeat([]byte{2}, 8<<10))); err != nil {
		t.Fatal(err)
	}
	select {
	case m, ok := <-got:
		if ok && len(m.Frames) == 2 && len(m.Frames[1]) == 8<<10 {
			t.Fatal("an 8 KiB frame passed a 4 KiB limit")
		}
	case <-time.After(2 * time.Second):
		// Nothing arrived: the connection was dropped at the header.
	}
}
