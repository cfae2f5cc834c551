//go:build faults

package app

import (
	"os"
	"syscall"
)

// fault kills this process at the named point between two writes of an act
// when MESH_FAULT names it: a test build (-tags faults) proves that an act
// killed there is, once serve catches up, done whole or not at all.
func fault(point string) {
	if os.Getenv("MESH_FAULT") == point {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}
