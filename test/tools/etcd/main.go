// Command etcd runs the etcd server from go.etcd.io/etcd/server/v3 so the
// local control plane can be built without downloading release archives.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
