package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/alecthomas/kong"
)

// The one rule for files a command reads: an input file that does not
// exist (or a directory where a file is wanted) is a usage error, exit 2,
// found while parsing, so no store is touched; the command line named
// something that is not there, as it would name an unknown flag. A file
// that exists but cannot be read or is not what it should be is found by
// the command: exit 1. kong's existingfile said the first; module check
// said it as a problem (exit 1); these types say it everywhere alike.

// InputFile is a file a command reads, made absolute (and ~/ expanded) as
// kong's existingfile did, so that what records it (a hand act's "from")
// names it wherever the command was run.
type InputFile string

// Decode implements kong.MapperValue.
func (f *InputFile) Decode(ctx *kong.DecodeContext) error {
	given, err := existing(ctx, false)
	if err != nil {
		return err
	}
	*f = InputFile(kong.ExpandPath(given))
	return nil
}

// InputPath is a file or a directory a command reads, kept as given:
// module check reports each problem under the name the person typed.
type InputPath string

// Decode implements kong.MapperValue.
func (p *InputPath) Decode(ctx *kong.DecodeContext) error {
	given, err := existing(ctx, true)
	if err != nil {
		return err
	}
	*p = InputPath(given)
	return nil
}

// existing takes the next value, as given, as a path that must exist, and
// be a file unless dirOK.
func existing(ctx *kong.DecodeContext, dirOK bool) (string, error) {
	var given string
	if err := ctx.Scan.PopValueInto("file", &given); err != nil {
		return "", err
	}
	st, err := os.Stat(kong.ExpandPath(given))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("%s does not exist", given)
	case err != nil:
		return "", err
	case st.IsDir() && !dirOK:
		return "", fmt.Errorf("%s is a directory, not a file", given)
	}
	return given, nil
}
