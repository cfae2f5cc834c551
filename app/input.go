package app

import (
	"fmt"
	"io"
	"os"
)

// What a person's input may weigh. Each is far above a real one and far
// below what would cost the controller (a 50 MB manifest took 722 MB to
// register); past it the input is refused, and the error says both sizes.
const (
	// MaxManifestBytes bounds a manifest file.
	MaxManifestBytes = 1 << 20
	// MaxSettingsBytes bounds a settings layer file.
	MaxSettingsBytes = 1 << 20
	// MaxSecretBytes bounds a secret's value.
	MaxSecretBytes = 1 << 20
	// MaxExportBytes bounds a secret export read for break-glass recovery.
	MaxExportBytes = 256 << 20
)

// ReadInput reads a person's input file, refusing one over limit bytes
// (ErrTooLarge) without reading it whole; what names it in the error.
func ReadInput(path string, limit int64, what string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		clear(b)
		size := "more"
		if fi, err := f.Stat(); err == nil {
			size = fmt.Sprint(fi.Size())
		}
		return nil, fmt.Errorf("%s: %w: %s bytes, and %s may be at most %s", path, ErrTooLarge, size, what, humanBytes(limit))
	}
	return b, nil
}
