package builder

import (
	"slices"
	"testing"
)

// Only a repository on this machine is named safe, however it is spelled;
// a remote one (URL or scp-like host:path) gets nothing, so that no
// upload-pack of ours is asked of its server.
func TestLocalRepository(t *testing.T) {
	for _, tc := range []struct {
		repository string
		want       []string // each among the names
	}{
		{"/srv/git/hello.git", []string{"/srv/git/hello.git", "/srv/git/hello.git/.git"}},
		{"/srv/git/hello/", []string{"/srv/git/hello/", "/srv/git/hello//.git", "/srv/git/hello", "/srv/git/hello/.git"}},
		{"file:///srv/git/a%20b.git", []string{"/srv/git/a b.git"}},
		{"../up.git", []string{"/work/up.git"}},
		{"./a:b", []string{"/work/b-1/a:b"}},
		{"https://git.example/hello.git", nil},
		{"ssh://git@git.example/hello.git", nil},
		{"git@git.example:hello.git", nil},
		{"file://host/srv/hello.git", nil},
	} {
		got := localRepository(tc.repository, "/work/b-1")
		if tc.want == nil && got != nil {
			t.Errorf("%s: named %q, want nothing", tc.repository, got)
		}
		for _, w := range tc.want {
			if !slices.Contains(got, w) {
				t.Errorf("%s: %q lacks %q", tc.repository, got, w)
			}
		}
	}
}
