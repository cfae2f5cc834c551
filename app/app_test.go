package app

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckName(t *testing.T) {
	good := []string{"a", "web1", "db-2", "nas-x-9", "a" + strings.Repeat("b", 62)}
	bad := []string{"", "Web1", "1web", "-web", "web_1", "web 1", "web.1", "../x", "a" + strings.Repeat("b", 63), "wéb"}
	for _, n := range good {
		if err := CheckName(n); err != nil {
			t.Errorf("CheckName(%q) = %v", n, err)
		}
	}
	for _, n := range bad {
		if err := CheckName(n); !errors.Is(err, ErrInvalidName) {
			t.Errorf("CheckName(%q) = %v, want ErrInvalidName", n, err)
		}
	}
}

func TestDefaultDataDir(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	if got := DefaultDataDir(env(map[string]string{"XDG_DATA_HOME": "/x", "HOME": "/h"}), 1000); got != "/x/mesh-controller" {
		t.Errorf("with XDG_DATA_HOME: %s", got)
	}
	if got := DefaultDataDir(env(map[string]string{"HOME": "/h"}), 1000); got != "/h/.local/share/mesh-controller" {
		t.Errorf("with HOME: %s", got)
	}
	// root's is the service's, whatever HOME says
	if got := DefaultDataDir(env(map[string]string{"XDG_DATA_HOME": "/x", "HOME": "/root"}), 0); got != "/var/lib/mesh-controller" {
		t.Errorf("as root: %s", got)
	}
}
