package archive

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"
)

// Receive streams r into a new file under tmpDir while hashing it, and
// returns the file's path and size once the bytes have the sha256 want
// (hex) names: the file is then a verified archive, ready for Unpack, and
// the caller's to move or remove. If the sha256 differs it removes the
// file and returns ErrDigest; max bounds the bytes read (ErrTooLarge). On
// any error nothing is left in tmpDir.
func Receive(r io.Reader, tmpDir, want string, max int64) (path string, size int64, err error) {
	want = strings.ToLower(want)
	if !IsDigest(want) {
		return "", 0, fmt.Errorf("receive an archive: %q is not a sha256 in hex: name the archive by its digest", want)
	}
	if max <= 0 {
		return "", 0, fmt.Errorf("receive archive %s: the bound %d is not positive: give a size limit", short(want), max)
	}
	f, err := os.CreateTemp(tmpDir, "receive-"+short(want)+"-*.tar.zst")
	if err != nil {
		return "", 0, fmt.Errorf("receive archive %s: %w", short(want), err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	h := sha256.New()
	// One byte past max tells a stream that is too long from one that
	// ends exactly at the bound.
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(r, max+1))
	if err != nil {
		return "", 0, fmt.Errorf("receive archive %s: %w", short(want), err)
	}
	if n > max {
		return "", 0, fmt.Errorf("receive archive %s: more than %d bytes: %w", short(want), max, ErrTooLarge)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return "", 0, fmt.Errorf("receive archive %s: got %d bytes with sha256 %s: %w", short(want), n, got, ErrDigest)
	}
	if err := f.Sync(); err != nil {
		return "", 0, fmt.Errorf("receive archive %s: %w", short(want), err)
	}
	if err := f.Close(); err != nil {
		return "", 0, fmt.Errorf("receive archive %s: %w", short(want), err)
	}
	return f.Name(), n, nil
}

// IsDigest says whether s is a sha256 in lowercase hex, as archives are named.
func IsDigest(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// short is a digest's first 12 characters, enough to name it in a message.
func short(digest string) string {
	if len(digest) > 12 {
		return digest[:12]
	}
	return digest
}
