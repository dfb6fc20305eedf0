// Package netns gives tests a network namespace of their own, as a pod's
// containers share one: the webhook's fixed KV-event endpoints (the
// abstract names @inferencecache-kvevents-pub/-replay, the sidecar's probe
// port) are then the test's alone and never collide with another test's
// engine on this host. A namespace is /proc/PID/ns/net of a holder process
// (`unshare --net`, loopback up; needs root and iproute2's ip); processes
// run in it through nsenter, and the test reaches it from a thread that
// joins it (setns). Every failure fails the test: nothing here skips.
package netns

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// NS is a network namespace.
type NS struct {
	// Path is /proc/PID/ns/net of the namespace's holder process.
	Path string
	hold io.WriteCloser
	cmd  *exec.Cmd
}

func start() (*NS, error) {
	cmd := exec.Command("unshare", "--net", "--", "sh", "-c", "ip link set lo up && echo up && read _")
	cmd.Stderr = os.Stderr
	hold, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("unshare --net (needs root): %w", err)
	}
	if line, _ := bufio.NewReader(out).ReadString('\n'); strings.TrimSpace(line) != "up" {
		_ = hold.Close()
		_ = cmd.Wait()
		return nil, fmt.Errorf("unshare --net (needs root) with iproute2's ip: %q", line)
	}
	return &NS{Path: fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid), hold: hold, cmd: cmd}, nil
}

// New returns a namespace that ends with t.
func New(t testing.TB) *NS {
	t.Helper()
	ns, err := start()
	if err != nil {
		t.Fatalf("a network namespace for the pod: %v", err)
	}
	t.Cleanup(func() { _ = ns.hold.Close(); _ = ns.cmd.Wait() })
	return ns
}

var (
	sharedOnce sync.Once
	shared     *NS
	sharedErr  error
)

// Shared returns one namespace for the whole test binary; its holder ends
// with the binary (it waits on its standard input).
func Shared(t testing.TB) *NS {
	t.Helper()
	sharedOnce.Do(func() { shared, sharedErr = start() })
	if sharedErr != nil {
		t.Fatalf("a network namespace for the pod: %v", sharedErr)
	}
	return shared
}

// Command is bin args run in ns: nsenter execs bin, so the process (and
// its PID) is bin's.
func (ns *NS) Command(t testing.TB, bin string, args ...string) *exec.Cmd {
	t.Helper()
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		t.Fatalf("nsenter (util-linux) runs the pod's processes in its network namespace: %v", err)
	}
	return exec.Command(nsenter, append([]string{"--net=" + ns.Path, "--", bin}, args...)...)
}

// Enter makes cmd, not yet started, run in ns (as Command does).
func (ns *NS) Enter(t testing.TB, cmd *exec.Cmd) {
	t.Helper()
	in := ns.Command(t, cmd.Path, cmd.Args[1:]...)
	cmd.Path, cmd.Args = in.Path, in.Args
}

// within runs f on a thread that joined ns; the sockets f makes keep the
// namespace. The thread then goes back to its own namespace and is
// unlocked: a thread that exits would fire the parent-death signal
// (Pdeathsig) of every process forked from it. If it cannot go back it
// stays locked and exits with its goroutine.
func within[T any](ns *NS, f func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		var zero T
		own, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			ch <- result{zero, err}
			runtime.UnlockOSThread()
			return
		}
		defer func() { _ = own.Close() }()
		fd, err := os.Open(ns.Path)
		if err != nil {
			ch <- result{zero, err}
			runtime.UnlockOSThread()
			return
		}
		defer func() { _ = fd.Close() }()
		if err := unix.Setns(int(fd.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{zero, fmt.Errorf("setns %s: %w", ns.Path, err)}
			runtime.UnlockOSThread()
			return
		}
		v, err := f()
		ch <- result{v, err}
		if unix.Setns(int(own.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
	}()
	r := <-ch
	return r.v, r.err
}

// Of is the network namespace of process pid, held by that process (the
// caller ends it): for Dial and Command only.
func Of(pid int) *NS { return &NS{Path: fmt.Sprintf("/proc/%d/ns/net", pid)} }

// Dial dials addr from inside ns.
func (ns *NS) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	return within(ns, func() (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	})
}

// DialShared dials addr from inside the Shared namespace (an HTTP
// transport's or a gRPC client's dialer); Shared must have been called.
func DialShared(ctx context.Context, network, addr string) (net.Conn, error) {
	if shared == nil {
		return nil, fmt.Errorf("dialing %s in the pod: no shared network namespace yet", addr)
	}
	return shared.Dial(ctx, network, addr)
}

// ForwardInto makes the host's TCP address addr reachable at the same
// address inside ns, as a cluster's Service is from a pod: a listener made
// inside ns, each connection copied to and from addr on the host, until t
// ends.
func (ns *NS) ForwardInto(t testing.TB, addr string) {
	t.Helper()
	ln, err := within(ns, func() (net.Listener, error) { return net.Listen("tcp", addr) })
	if err != nil {
		t.Fatalf("listening on %s in the pod: %v", addr, err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = in.Close() }()
				out, err := net.Dial("tcp", addr)
				if err != nil {
					return
				}
				defer func() { _ = out.Close() }()
				go func() { _, _ = io.Copy(out, in); _ = out.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(in, out)
			}()
		}
	}()
}

// pid is the namespace's holder process.
func (ns *NS) pid() int { return ns.cmd.Process.Pid }

// Link joins a and b by a veth pair, as two pods of one node are joined:
// eth0 in each, a at 10.213.0.1/30 and b at 10.213.0.2/30, both up. The
// pair is made inside a (its peer moved straight into b), so the host's
// own namespace never holds either end, and it goes with the namespaces.
// It returns the two addresses.
func Link(t testing.TB, a, b *NS) (aIP, bIP string) {
	t.Helper()
	const aAddr, bAddr = "10.213.0.1", "10.213.0.2"
	run := func(ns *NS, args ...string) {
		t.Helper()
		if out, err := ns.Command(t, "ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s in %s: %v\n%s", strings.Join(args, " "), ns.Path, err, out)
		}
	}
	run(a, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", fmt.Sprint(b.pid()))
	run(a, "addr", "add", aAddr+"/30", "dev", "eth0")
	run(a, "link", "set", "eth0", "up")
	run(b, "addr", "add", bAddr+"/30", "dev", "eth0")
	run(b, "link", "set", "eth0", "up")
	return aAddr, bAddr
}
