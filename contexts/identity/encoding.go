package identity

import "encoding/base32"

// base32NoPad spells tokens with letters and digits only, so they survive
// shells, URLs and being read aloud.
var base32NoPad = base32.StdEncoding.WithPadding(base32.NoPadding)
