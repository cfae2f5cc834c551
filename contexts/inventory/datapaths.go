package inventory

import (
	"fmt"
	"maps"
	"path"
	"slices"
)

// PathsOverlap says whether two data paths on one node are one place, or
// one lies inside the other: deleting either would delete (part of) the
// other.
func PathsOverlap(a, b string) bool {
	a, b = path.Clean(a), path.Clean(b)
	return a == b || inside(a, b) || inside(b, a)
}

// inside says whether p lies beneath dir.
func inside(p, dir string) bool {
	return len(p) > len(dir) && p[:len(dir)] == dir && (dir == "/" || p[len(dir)] == '/')
}

// DataPathClashes says, of the modules adding on a node, each data set
// whose path is one another module there keeps (here, or adding before
// it), or lies inside or around one: two assignments never hold one place,
// so that unassigning and cleaning up one never deletes what the other
// serves from (issue 30, finding 1).
func DataPathClashes(node string, here map[string]Manifest, adding []Manifest) []string {
	type held struct{ module, set, path string }
	var claimed []held
	for _, name := range slices.Sorted(maps.Keys(here)) {
		for _, d := range here[name].Data {
			claimed = append(claimed, held{name, d.Name, d.Path})
		}
	}
	var problems []string
	for _, m := range adding {
		for _, d := range m.Data {
			for _, c := range claimed {
				if c.module != m.Module && PathsOverlap(c.path, d.Path) {
					problems = append(problems, fmt.Sprintf("%s's data %s (%s) and %s's data %s (%s) are one place on %s: two modules may not keep the same path, or one inside the other; change one manifest's data path",
						c.module, c.set, c.path, m.Module, d.Name, d.Path, node))
				}
			}
		}
		for _, d := range m.Data {
			claimed = append(claimed, held{m.Module, d.Name, d.Path})
		}
	}
	return problems
}
