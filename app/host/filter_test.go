package host

import (
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"strings"
	"testing"
)

// A filter this host cannot apply is refused, in one line, before any of
// its declaration is applied; never ignored.
func TestDeclaredFilter_Refused(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	st := &State{Node: "web1", ControllerKey: pub}
	withFilter := func(serial int, ruleset string) map[string]any {
		return map[string]any{"node": "web1", "serial": serial, "modules": []any{},
			"filter": map[string]any{"kind": "nftables", "ruleset": ruleset}}
	}
	good := "table inet mesh {\n\tchain input {\n\t\ttype filter hook input priority 0; policy drop;\n\t\tct state established,related accept\n\t}\n}\n"
	oneLine := func(t *testing.T, why string) {
		t.Helper()
		if strings.Contains(why, "\n") || !strings.HasPrefix(why, "refused: the packet filter: ") {
			t.Fatalf("not one line saying the filter was refused: %q", why)
		}
	}

	t.Run("no filter", func(t *testing.T) {
		f, serial, why := declaredFilter(st, 0, sealed(t, priv, map[string]any{"node": "web1", "serial": 1, "modules": []any{}}))
		if f != nil || serial != 1 || why != "" {
			t.Fatalf("got %v %d %q", f, serial, why)
		}
	})
	t.Run("left to apply", func(t *testing.T) {
		// Not above the last applied: apply's refusal says more.
		if f, _, why := declaredFilter(st, 5, sealed(t, priv, withFilter(5, good))); f != nil || why != "" {
			t.Fatalf("got %v %q", f, why)
		}
	})
	t.Run("no nft, or not root", func(t *testing.T) {
		t.Setenv("PATH", t.TempDir())
		was := nftElsewhere
		nftElsewhere = nil
		t.Cleanup(func() { nftElsewhere = was })
		_, serial, why := declaredFilter(st, 0, sealed(t, priv, withFilter(1, good)))
		oneLine(t, why)
		want := "nft is not installed"
		if os.Geteuid() != 0 {
			want = "does not run as root"
		}
		if serial != 1 || !strings.Contains(why, want) {
			t.Fatalf("serial %d: %q, want %q", serial, why, want)
		}
	})
	t.Run("nft -c refuses it", func(t *testing.T) {
		if err := filterUsable(); err != nil {
			if os.Getenv("MESH_TEST_TOOLS") != "" || os.Getenv("CI") != "" {
				t.Fatalf("make test runs as root with nft: %v", err)
			}
			t.Skipf("nft -c needs a host that can apply a filter: %v", err)
		}
		_, _, why := declaredFilter(st, 0, sealed(t, priv, withFilter(1, strings.Replace(good, "accept\n", "accept\n\t\ttcp dport 70000 accept\n", 1))))
		oneLine(t, why)
		if !strings.Contains(why, "nft -c -f -") || !strings.Contains(why, "70000") {
			t.Fatalf("does not say what nft said: %q", why)
		}
		if f, _, why := declaredFilter(st, 0, sealed(t, priv, withFilter(1, good))); f == nil || why != "" {
			t.Fatalf("a good ruleset refused: %q", why)
		}
	})
}
