package app

import (
	"runtime"
	"runtime/debug"

	"mesh-controller/app/protocol"
)

// Build is what a binary says of itself: 'version --json'.
type Build struct {
	// Version is the one stamped at link time, "" for a development build.
	Version     string `json:"version"`
	Development bool   `json:"development"`
	Go          string `json:"go"`
	Protocol    string `json:"protocol"`
	// Commit is the revision the Go toolchain stamped (a build inside a
	// git checkout, without -buildvcs=false), Modified that the tree had
	// changes; both absent when not stamped.
	Commit   string `json:"commit,omitempty"`
	Modified bool   `json:"modified,omitempty"`
}

// BuiltAs is this binary, given the version stamped into it.
func BuiltAs(version string) Build {
	b := Build{Version: version, Development: version == "", Go: runtime.Version(), Protocol: protocol.Version}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Commit = s.Value
			case "vcs.modified":
				b.Modified = s.Value == "true"
			}
		}
	}
	return b
}
