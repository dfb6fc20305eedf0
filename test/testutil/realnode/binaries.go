package realnode

import "github.com/inferencecache/operator/test/controlplane"

// Names of the binaries in Dir.
var Names = []string{"kubelet", "kube-proxy", "containerd", "containerd-shim-runc-v2", "ctr", "coredns", "pause"}

// Dir returns the folder holding the node's binaries. It honours NODE_DIR
// (set by the Makefile) and otherwise runs test/tools/install-node.sh,
// which builds whatever is missing into a per-user cache.
var Dir = controlplane.Installed("NODE_DIR", "install-node.sh", Names)
