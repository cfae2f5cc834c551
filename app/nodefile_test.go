package app

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
)

func TestReadNodeNames(t *testing.T) {
	t.Run("names and token lines", func(t *testing.T) {
		names, err := ReadNodeNames(strings.NewReader("web1\n  web2  \n# a comment\n\nload1 meshjoin_abc\n"), "f")
		if err != nil || strings.Join(names, ",") != "web1,web2,load1" {
			t.Fatalf("%v, %v", names, err)
		}
	})
	for name, tc := range map[string]struct {
		in   string
		want error
		line string
	}{
		"not a name":   {"web1\nWeb2\n", ErrInvalidName, "f line 2: "},
		"named twice":  {"web1\nweb2\nweb1 tok\n", ErrNamedTwice, "f line 3: web1 is named twice (first on line 1)"},
		"none":         {"# nothing\n\n", ErrNoNodes, "f names no node"},
		"a long token": {"web1\nweb2 " + strings.Repeat("x", 70000) + "\n", nil, "f line 2: "},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ReadNodeNames(strings.NewReader(tc.in), "f")
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) || !strings.HasPrefix(err.Error(), tc.line) {
				t.Fatalf("got %v, want %v starting %q", err, tc.want, tc.line)
			}
		})
	}
	t.Run("at most MaxNodesAtOnce", func(t *testing.T) {
		lines := func(n int) io.Reader {
			var b strings.Builder
			for i := 1; i <= n; i++ {
				fmt.Fprintf(&b, "load%d\n", i)
			}
			return strings.NewReader(b.String())
		}
		if names, err := ReadNodeNames(lines(MaxNodesAtOnce), "f"); err != nil || len(names) != MaxNodesAtOnce {
			t.Fatalf("%d names: %v", len(names), err)
		}
		_, err := ReadNodeNames(lines(MaxNodesAtOnce+1), "f")
		if !errors.Is(err, ErrTooManyNodes) || !strings.Contains(err.Error(), "line 100001 is one too many") {
			t.Fatalf("one too many: %v", err)
		}
	})
}
