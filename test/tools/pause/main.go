// Command pause is the real node's pod sandbox image (test/tools/install-node.sh
// builds it; the harness in test/testutil/realnode packs it as the pinned
// sandbox image): it holds the pod's namespaces, reaps the orphans it
// inherits as the pod's first process, and exits on SIGINT or SIGTERM, as
// Kubernetes' own pause does. No registry is reachable from the test
// machine, so the kubelet's default image cannot be pulled.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
