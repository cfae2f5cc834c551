package inventory

import (
	"fmt"
	"maps"
	"path"
	"slices"
	"sort"
	"strings"
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

// heldPath is a data set's place on a node, and whose it is.
type heldPath struct{ module, set, path string }

// DataPathClashes says, of the modules adding on a node, each data set
// whose path is one another module there keeps (here, or adding before
// it), or lies inside or around one: two assignments never hold one place,
// so that unassigning and cleaning up one never deletes what the other
// serves from (issue 30, finding 1). A module's own data sets may nest.
// Each path is looked up, not compared with every other: a node's data
// sets number in the thousands.
func DataPathClashes(node string, here map[string]Manifest, adding []Manifest) []string {
	byPath := map[string][]heldPath{} // clean path → who keeps it
	var sorted []string               // the clean paths, sorted: for what lies inside one
	add := func(module string, ds []DataSpec) {
		for _, d := range ds {
			p := path.Clean(d.Path)
			if _, ok := byPath[p]; !ok {
				sorted = append(sorted, p)
			}
			byPath[p] = append(byPath[p], heldPath{module, d.Name, d.Path})
		}
		slices.Sort(sorted)
	}
	for _, name := range slices.Sorted(maps.Keys(here)) {
		add(name, here[name].Data)
	}
	var problems []string
	for _, m := range adding {
		for _, d := range m.Data {
			p := path.Clean(d.Path)
			var clash []heldPath
			// The same place, or one around it.
			for dir := p; ; dir = path.Dir(dir) {
				clash = append(clash, byPath[dir]...)
				if dir == "/" || dir == "." {
					break
				}
			}
			// One inside it.
			for i := sort.SearchStrings(sorted, p+"/"); i < len(sorted) && strings.HasPrefix(sorted[i], p+"/"); i++ {
				clash = append(clash, byPath[sorted[i]]...)
			}
			for _, c := range clash {
				if c.module != m.Module {
					problems = append(problems, fmt.Sprintf("%s's data %s (%s) and %s's data %s (%s) are one place on %s: two modules may not keep the same path, or one inside the other; change one manifest's data path",
						c.module, c.set, c.path, m.Module, d.Name, d.Path, node))
				}
			}
		}
		add(m.Module, m.Data)
	}
	return problems
}
