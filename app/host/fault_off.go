//go:build !faults

package host

// fault marks a point of the host's own upgrade. Only a test build (-tags
// faults) acts on it; see fault_on.go.
func fault(string) {}
