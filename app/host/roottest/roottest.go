// Package roottest lets tests of a host's root see a directory tree whole,
// links not followed, and say what an attack made, changed or removed.
package roottest

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// Tree is every entry under dir, links not followed: a file's content, a
// link's target as "link to T", a directory as "dir".
func Tree(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case e.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			out[rel] = "link to " + target
			return err
		case e.IsDir():
			out[rel] = "dir"
		default:
			b, err := os.ReadFile(p)
			out[rel] = string(b)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Unchanged fails the test for every entry made, changed or removed between
// two Trees; where (if given) says which tree, e.g. "outside the root, ".
func Unchanged(t testing.TB, where string, before, after map[string]string) {
	t.Helper()
	for p, was := range before {
		if now, ok := after[p]; !ok {
			t.Errorf("%s%s was removed", where, p)
		} else if now != was {
			t.Errorf("%s%s changed: %q, was %q", where, p, now, was)
		}
	}
	for p := range after {
		if _, ok := before[p]; !ok {
			t.Errorf("%s%s was made", where, p)
		}
	}
}
