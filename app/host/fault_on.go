//go:build faults

package host

import (
	"os"
	"syscall"
)

// fault kills this process at the named point of the host's own upgrade
// when MESH_FAULT names it: a test build (-tags faults) proves that a host
// killed there comes back on one of its two binaries, and converges.
func fault(point string) {
	if os.Getenv("MESH_FAULT") == point {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}
