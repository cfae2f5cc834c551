package protocol

import "strings"

// DeclaredHost is the host release a node should run (issue 31): its
// version, as the host binary says it ('mesh-host version'), and the
// archive that holds it, when the controller keeps one. A host that runs
// another version upgrades itself: it fetches the archive (its digest
// verified), checks the binary in it says this version, replaces its own
// executable and re-executes itself, its modules running on. Without an
// archive (a rollback to a version the controller has no release of) the
// host uses the binary it kept when it last upgraded, if it is that
// version, and refuses the declaration otherwise.
type DeclaredHost struct {
	Archive *Archive `json:"archive,omitempty"`
	Version string   `json:"version"`
}

// HostBinaryName is the one file a host release's archive holds: the
// mesh-host binary, at its top.
const HostBinaryName = "mesh-host"

// MaxHostVersion bounds a host version's length.
const MaxHostVersion = 128

// ValidHostVersion says whether v can be a host version: what 'git
// describe' stamps (v0.3.0, v0.3.0-4-gabc1234-dirty) or a development
// build's words; 1 to MaxHostVersion printable ASCII characters, with no
// space at either end.
func ValidHostVersion(v string) bool {
	if v == "" || len(v) > MaxHostVersion || strings.TrimSpace(v) != v {
		return false
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] > 0x7e {
			return false
		}
	}
	return true
}

// hostProblems are what is wrong with a declaration's host part.
func (h *DeclaredHost) problems(bad func(field, format string, args ...any)) {
	if h == nil {
		return
	}
	if !ValidHostVersion(h.Version) {
		bad("host.version", "%q is not a host version: 1 to %d printable characters", h.Version, MaxHostVersion)
	}
	if a := h.Archive; a != nil {
		archiveProblems("host.archive", a, bad)
	}
}

// archiveProblems are what is wrong with an archive's name and sizes.
func archiveProblems(field string, a *Archive, bad func(field, format string, args ...any)) {
	if !digestRule.MatchString(a.Digest) {
		bad(field+".digest", "%q is not a sha256 in lowercase hex", a.Digest)
	}
	if a.Bytes <= 0 || a.Bytes > MaxArchiveBytes {
		bad(field+".bytes", "%d is outside 1..%d", a.Bytes, int64(MaxArchiveBytes))
	}
	if a.UnpackedBytes < 0 || a.UnpackedBytes > MaxUnpackedBytes {
		bad(field+".unpacked_bytes", "%d is outside 0..%d", a.UnpackedBytes, MaxUnpackedBytes)
	}
}
