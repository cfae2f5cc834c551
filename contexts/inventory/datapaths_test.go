package inventory

import (
	"fmt"
	"strings"
	"testing"
)

// Two modules on a node never keep one place: the same path, one inside
// the other, or around it; a sibling that only shares a prefix of letters
// is another place, and a module's own data sets may nest.
func TestDataPathClashes(t *testing.T) {
	data := func(module string, paths ...string) Manifest {
		m := Manifest{Module: module}
		for i, p := range paths {
			m.Data = append(m.Data, DataSpec{Name: fmt.Sprintf("d%d", i), Path: p})
		}
		return m
	}
	here := map[string]Manifest{"a": data("a", "/srv/a", "/srv/a/cache")}
	for _, c := range []struct {
		adding []Manifest
		want   []string
	}{
		{[]Manifest{data("b", "/srv/a")}, []string{"a's data d0 (/srv/a) and b's data d0 (/srv/a)", "a's data d1 (/srv/a/cache) and b's data d0 (/srv/a)"}},
		{[]Manifest{data("b", "/srv/a/x")}, []string{"a's data d0 (/srv/a) and b's data d0 (/srv/a/x)"}},
		{[]Manifest{data("b", "/srv")}, []string{"a's data d0 (/srv/a) and b's data d0 (/srv)", "a's data d1 (/srv/a/cache) and b's data d0 (/srv)"}},
		{[]Manifest{data("b", "/srv/ab", "/srv/b", "/srv/b/inner")}, nil},
		{[]Manifest{data("b", "/srv/b"), data("c", "/srv/b/c")}, []string{"b's data d0 (/srv/b) and c's data d0 (/srv/b/c)"}},
	} {
		got := DataPathClashes("web1", here, c.adding)
		if len(got) != len(c.want) {
			t.Errorf("%+v: %d problems, want %d: %v", c.adding, len(got), len(c.want), got)
			continue
		}
		for i, w := range c.want {
			if !strings.HasPrefix(got[i], w+" are one place on web1") {
				t.Errorf("%+v: problem %q, want %q", c.adding, got[i], w)
			}
		}
	}
}

// Judging five modules of 1,000 data sets each against each other is a
// lookup a path, not a comparison of every pair.
func BenchmarkDataPathClashes(b *testing.B) {
	var adding []Manifest
	for m := range 5 {
		mod := Manifest{Module: fmt.Sprintf("m%d", m)}
		for i := range 1000 {
			mod.Data = append(mod.Data, DataSpec{Name: fmt.Sprintf("d%d", i), Path: fmt.Sprintf("/srv/m%d/%s/%d", m, strings.Repeat("p", 200), i)})
		}
		adding = append(adding, mod)
	}
	for b.Loop() {
		if ps := DataPathClashes("web1", nil, adding); len(ps) != 0 {
			b.Fatal(ps[0])
		}
	}
}
