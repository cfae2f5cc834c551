//go:build !faults

package app

// fault marks a point between two writes of an act. Only a test build
// (-tags faults) acts on it; see fault_on.go.
func fault(string) {}
