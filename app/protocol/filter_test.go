package protocol

import (
	"strings"
	"testing"
)

func TestOneMeshTable(t *testing.T) {
	good := "# the mesh's filter\ntable inet mesh {\n\tchain input {\n\t\ttype filter hook input priority 0; policy drop;\n\t\tct state established,related accept # kept\n\t\ttcp dport 22 accept comment \"ssh {\"\n\t}\n}\n"
	if err := OneMeshTable(good); err != nil {
		t.Fatalf("a table inet mesh refused: %v", err)
	}
	for _, bad := range []string{
		"",
		"flush ruleset\ntable inet mesh {\n}\n",
		"table inet other {\n}\n",
		"table ip mesh {\n}\n",
		"table inet mesh {\n}\ntable inet other {\n}\n",
		"table inet mesh {\n}\ndelete table inet filter\n",
		"table inet mesh {\n",
		"table inet mesh {\n}}\n",
		"table inet mesh {\ninclude \"/etc/nftables.conf\"\n}\n",
		"table inet mesh\n",
		strings.Repeat("#", MaxFilterBytes+1),
	} {
		if err := OneMeshTable(bad); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}
