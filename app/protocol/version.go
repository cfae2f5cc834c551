package protocol

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Version is the protocol this build speaks, major.minor. Every message a
// host sends carries it (Signed), as does every declaration (inside what
// is signed, and on its Envelope), the join request and the controller's
// answers. A variable, not a constant, so that a test can build a host or
// a controller that speaks another version:
//
//	go build -ldflags "-X mesh-controller/app/protocol.Version=1.3" ./cmd/mesh-host
//
// Within a major a newer minor only adds fields, which an older reader
// ignores (protocol.md); a new major is a change an older reader cannot
// read.
var Version = "1.1"

// Unversioned is what a message that carries no protocol speaks: every host
// and controller before versions were carried (v0.2.0 and older).
const Unversioned = "1.0"

// Of is the protocol a message says it speaks: Unversioned when it says none.
func Of(v string) string {
	if v == "" {
		return Unversioned
	}
	return v
}

// Ver is a protocol version, major.minor.
type Ver struct{ Major, Minor int }

// String is major.minor.
func (v Ver) String() string { return fmt.Sprintf("%d.%d", v.Major, v.Minor) }

// ErrNotAVersion means a protocol version is not major.minor.
var ErrNotAVersion = errors.New("not a protocol version (major.minor)")

// ParseVersion reads major.minor; "" is Unversioned.
func ParseVersion(s string) (Ver, error) {
	major, minor, ok := strings.Cut(Of(s), ".")
	ma, err1 := strconv.Atoi(major)
	mi, err2 := strconv.Atoi(minor)
	if !ok || err1 != nil || err2 != nil || ma < 0 || mi < 0 || len(s) > 16 {
		return Ver{}, fmt.Errorf("%q: %w", s, ErrNotAVersion)
	}
	return Ver{ma, mi}, nil
}

// ours is Version, parsed. A build stamped with a Version that does not
// parse is a build defect: it speaks nothing, and refuses everyone.
func ours() (Ver, error) { return ParseVersion(Version) }

// MismatchError is a protocol a party will not speak: a host's to its
// controller (Speaks), or a declaration's to its host (Reads). Its words
// are the one line a person reads: both versions, and what to do.
type MismatchError struct {
	// Theirs is what the other party speaks; Ours this build's.
	Theirs, Ours string
	// Host says the refusing party is the controller refusing a host (the
	// host's side is said in Reads).
	Host bool
}

// Error names both versions and what to do: the older party is upgraded.
func (e *MismatchError) Error() string {
	t, _ := ParseVersion(e.Theirs)
	o, _ := ParseVersion(e.Ours)
	if !e.Host {
		return fmt.Sprintf("declaration speaks protocol %s; this host reads %d.x: upgrade the host", e.Theirs, o.Major)
	}
	if t.Major < o.Major || (t.Major == o.Major && t.Minor < o.Minor) {
		return fmt.Sprintf("the host speaks protocol %s, this controller %s (it speaks %s): upgrade the host", e.Theirs, e.Ours, spoken(o))
	}
	return fmt.Sprintf("the host speaks protocol %s, this controller %s (it speaks %s): upgrade the controller", e.Theirs, e.Ours, spoken(o))
}

// spoken says the versions a controller of version o speaks.
func spoken(o Ver) string {
	if o.Minor == 0 {
		return fmt.Sprintf("%d.0 to %d.1", o.Major, o.Major)
	}
	return fmt.Sprintf("%d.%d to %d.%d", o.Major, o.Minor-1, o.Major, o.Minor+1)
}

// Speaks is the controller's rule: it speaks to hosts of its own major
// whose minor is within one of its own (N−1, N, N+1), and refuses anything
// else with a *MismatchError. theirs "" is Unversioned.
func Speaks(theirs string) error {
	o, err := ours()
	if err != nil {
		return err
	}
	t, err := ParseVersion(theirs)
	if err == nil && t.Major == o.Major && t.Minor >= o.Minor-1 && t.Minor <= o.Minor+1 {
		return nil
	}
	return &MismatchError{Theirs: shownVersion(theirs), Ours: Version, Host: true}
}

// Reads is the host's rule for a declaration: one of a newer major than
// this build is refused (*MismatchError), before anything is touched; any
// other is applied, what a newer minor adds being ignored.
func Reads(declared string) error {
	o, err := ours()
	if err != nil {
		return err
	}
	d, err := ParseVersion(declared)
	if err == nil && d.Major <= o.Major {
		return nil
	}
	return &MismatchError{Theirs: shownVersion(declared), Ours: Version}
}

// shownVersion is a version as an error says it: bounded, and Unversioned
// for none.
func shownVersion(v string) string {
	v = Of(v)
	if len(v) > 16 {
		v = v[:16] + "…"
	}
	return strconv.Quote(v)[1 : len(strconv.Quote(v))-1]
}

// Stamped is one of the controller's answers (OKReply, JoinReply, None,
// Envelope) with its protocol said, as every answer says it; anything else
// as it is.
func Stamped(v any) any {
	switch a := v.(type) {
	case OKReply:
		a.Protocol = Version
		return a
	case JoinReply:
		a.Protocol = Version
		return a
	case None:
		a.Protocol = Version
		return a
	case Envelope:
		if a.Protocol == "" {
			a.Protocol = Version
		}
		return a
	}
	return v
}
