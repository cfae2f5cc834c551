package app_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

func goList(t *testing.T, args ...string) []string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %v: %v", args, err)
	}
	return strings.Fields(string(out))
}

// Contexts never import each other, app or cmd (house rule 2): only app
// crosses contexts.
func TestContextsImportNoOtherContext(t *testing.T) {
	for _, pkg := range goList(t, "./contexts/...") {
		for _, dep := range goList(t, "-deps", pkg) {
			if dep == pkg {
				continue
			}
			if strings.HasPrefix(dep, "mesh-controller/contexts/") ||
				strings.HasPrefix(dep, "mesh-controller/app") ||
				strings.HasPrefix(dep, "mesh-controller/cmd") {
				t.Errorf("%s imports %s", pkg, dep)
			}
		}
	}
}

// The binaries stay static and lean (house rule 12): no cgo, no cgo SQLite
// driver, no testing package.
func TestBinariesAreLean(t *testing.T) {
	bins := goList(t, "-f", "{{if eq .Name \"main\"}}{{.ImportPath}}{{end}}", "./cmd/...")
	if len(bins) < 2 {
		t.Fatalf("found binaries %v, want mesh-controller and mesh-host", bins)
	}
	for _, bin := range bins {
		for _, dep := range goList(t, "-deps", bin) {
			switch {
			case dep == "testing", dep == "runtime/cgo", strings.Contains(dep, "mattn/go-sqlite3"):
				t.Errorf("%s depends on %s", bin, dep)
			}
		}
	}
}
