// Package migrations holds every context's numbered SQL migrations, embedded
// in the binary, one file system per context. go:embed cannot reach parent
// directories, so the files live beside this package.
package migrations

import (
	"embed"
	"io/fs"
)

//go:embed inventory identity secrets licences builds health
var files embed.FS

// For is the file system of one context's migrations (NNNN_what.sql) and its
// checked-in schema.sql. It panics on a context that has no directory, which
// is a programming error caught by the tests.
func For(context string) fs.FS {
	sub, err := fs.Sub(files, context)
	if err != nil {
		panic(err)
	}
	if _, err := fs.Stat(sub, "."); err != nil {
		panic("migrations: no directory for context " + context)
	}
	return sub
}
