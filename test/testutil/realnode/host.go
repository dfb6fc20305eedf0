package realnode

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// hostState is what a node must leave as it found it on the host: its
// network (links, addresses, routes, iptables rules), its mounts, the
// kernel settings a kubelet or kube-proxy would change and the nodes'
// cgroups.
type hostState struct {
	network, mounts, sysctls, cgroups string
}

// hostSysctls are read before and after: the kubelet's (setupKernelTunables)
// and kube-proxy's (conntrack, forwarding, bridge netfilter).
var hostSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
	"net/ipv4/ip_forward", "net/ipv4/conf/all/route_localnet",
	"net/netfilter/nf_conntrack_max", "net/netfilter/nf_conntrack_tcp_timeout_established",
	"net/netfilter/nf_conntrack_tcp_timeout_close_wait", "net/bridge/bridge-nf-call-iptables",
}

var counters = regexp.MustCompile(`\[\d+:\d+\]`)

func readHost() (hostState, error) {
	var h hostState
	var b strings.Builder
	for _, args := range [][]string{{"ip", "-o", "link", "show"}, {"ip", "-o", "addr", "show"}, {"ip", "route", "show", "table", "all"}, {"iptables-save"}} {
		out, err := exec.Command(args[0], args[1:]...).Output()
		if err != nil {
			return h, fmt.Errorf("%s: %w", strings.Join(args, " "), err)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "#") {
				continue // iptables-save's dated comments
			}
			b.WriteString(counters.ReplaceAllString(line, "") + "\n")
		}
	}
	h.network = b.String()

	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return h, err
	}
	var mounts []string
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		// Mount point, options, then after " - " the type and source;
		// not the mount IDs, which a remount renumbers.
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		_, post, _ := strings.Cut(line, " - ")
		mounts = append(mounts, f[4]+" "+post)
	}
	slices.Sort(mounts)
	h.mounts = strings.Join(mounts, "\n")

	b.Reset()
	for _, k := range hostSysctls {
		v, err := os.ReadFile("/proc/sys/" + k)
		if err != nil {
			v = []byte("absent")
		}
		fmt.Fprintf(&b, "%s=%s\n", k, strings.TrimSpace(string(v)))
	}
	h.sysctls = b.String()

	b.Reset()
	// Only the nodes' own: the machine's process manager makes and
	// removes its cgroups as it likes.
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/inferencecache-*")
	for _, d := range dirs {
		b.WriteString(d + "\n")
	}
	h.cgroups = b.String()
	return h, nil
}

// same reports how the host differs now from h.
func (h hostState) same() error {
	now, err := readHost()
	if err != nil {
		return err
	}
	var diffs []string
	for _, c := range []struct{ what, was, is string }{
		{"network (links, addresses, routes, iptables)", h.network, now.network},
		{"mounts", h.mounts, now.mounts},
		{"sysctls", h.sysctls, now.sysctls},
		{"cgroups", h.cgroups, now.cgroups},
	} {
		if c.was != c.is {
			diffs = append(diffs, fmt.Sprintf("the host's %s changed:\n%s", c.what, lineDiff(c.was, c.is)))
		}
	}
	if len(diffs) > 0 {
		return fmt.Errorf("%s", strings.Join(diffs, "\n"))
	}
	return nil
}

// lineDiff lists the lines only in a (-) and only in b (+).
func lineDiff(a, b string) string {
	as, bs := strings.Split(a, "\n"), strings.Split(b, "\n")
	var out []string
	for _, l := range as {
		if !slices.Contains(bs, l) {
			out = append(out, "- "+l)
		}
	}
	for _, l := range bs {
		if !slices.Contains(as, l) {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}
