package protocol

// Archives cross the broker through the controller (issue 28): no host,
// module or builder is given any of the JetStream API, since whoever may
// use it chooses where the server publishes (a request's reply subject, a
// push consumer's deliver subject) and what it keeps (a rollup, a delete
// marker). A host asks the controller for the pieces of an archive
// declared to it, one request a piece, answered into its own inbox; a
// builder hands the controller the pieces of the archive a build it was
// asked for made, and the controller stores them under their digest if no
// archive of that name is stored, never over one.

// ArchiveRead is what a host asks for a piece of an archive on
// (mesh.node.N.archive, a request): ArchiveReadRequest, answered with the
// piece's bytes and the ArchiveSize and ArchiveOffset headers, or no
// bytes and the ArchiveError header.
const ArchiveRead = "archive"

// ArchiveReadRequest asks for the bytes of an archive from Offset on (at
// most ArchiveReadPiece of them).
type ArchiveReadRequest struct {
	Digest string `json:"digest"`
	Offset int64  `json:"offset"`
}

// ArchivePiece is the most bytes one upload's piece carries: under a
// member's largest message (1 MiB) with its headers.
const ArchivePiece = 512 << 10

// ArchiveReadPiece is the most bytes one read is answered with: the
// controller's answers are bounded by the broker's largest message (8 MiB),
// not a member's, and fewer, larger pieces cost hosts and the broker less.
const ArchiveReadPiece = 2 << 20

// The headers of archive pieces.
const (
	// ArchiveSize is the archive's whole size, in bytes.
	ArchiveSize = "Mesh-Archive-Size"
	// ArchiveOffset is where in the archive a piece begins.
	ArchiveOffset = "Mesh-Archive-Offset"
	// ArchiveDigest names the archive an upload's piece is of (sha256, hex).
	ArchiveDigest = "Mesh-Archive-Digest"
	// ArchiveBuild is the build an upload's archive is the outcome of.
	ArchiveBuild = "Mesh-Build"
	// ArchiveError says why a read was not answered with bytes.
	ArchiveError = "Mesh-Error"
	// ArchiveBusy is the ArchiveError of a controller with no room for the
	// read now: the host asks again a moment later.
	ArchiveBusy = "busy"
)

// ArchiveUploadSubject is where the builder on node hands the controller
// its archive's pieces (requests, each answered ArchiveUploadReply). The
// first piece, at offset 0, carries no bytes: it asks whether the archive
// is wanted (Stored says it is held already) and opens the upload.
func ArchiveUploadSubject(node string) string { return "mesh.build.archive." + node }

// ArchiveUploadReply answers an upload's piece.
type ArchiveUploadReply struct {
	OK bool `json:"ok"`
	// Stored: an archive of that digest is held already; send no more.
	Stored bool   `json:"stored,omitempty"`
	Error  string `json:"error,omitempty"`
}

// BuildResultSubject is where the builder on node reports a build's
// outcome (a request: the controller answers once it has recorded it).
// The node in the subject is the broker's word, not the builder's: only
// that node's builder may publish there.
func BuildResultSubject(node string) string { return BuildResult + "." + node }

// BuildProgressSubject is where the builder on node sends a build's log
// lines as they are written.
func BuildProgressSubject(node string) string { return BuildProgress + "." + node }

// BuilderInboxPrefix is the inbox prefix of the builder on node: beneath
// the node's own (the host's), so no other node's user reads its answers.
func BuilderInboxPrefix(node string) string { return HostInboxPrefix(node) + ".builder" }
