package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"mesh-controller/app/host/roottest"
	"mesh-controller/app/protocol"
)

// versionFlag links a program that speaks protocol v.
func versionFlag(v protocol.Ver) []string {
	return []string{"-ldflags", "-X mesh-controller/app/protocol.Version=" + v.String()}
}

// Real hosts and a real controller built to speak other protocols: a
// controller two minors ahead of this tree refuses this tree's host at
// join, in one line naming both, its token left unused; a host one minor
// behind it joins with that token, and one a minor ahead joins too. The
// first host downgraded to this tree's (two behind) is not spoken to: its
// ask and its apply report are answered with the same line, its beats are
// dropped and counted, and the self-check raises node.protocol-mismatch
// naming both; back on the version one behind, it is heard and the
// condition clears.
func TestProtocol_HostsOfOtherVersions(t *testing.T) {
	t.Parallel()
	ours, err := protocol.ParseVersion(protocol.Version)
	if err != nil {
		t.Fatal(err)
	}
	at := func(minor int) protocol.Ver { return protocol.Ver{Major: ours.Major, Minor: ours.Minor + minor} }
	controllerV, behindV, aheadV := at(2), at(1), at(3)
	mc := buildProgramWith(t, "mesh-controller", "../../cmd/mesh-controller", versionFlag(controllerV)...)
	twoBehind := buildHost(t)
	oneBehind := buildProgramWith(t, "mesh-host", "../../cmd/mesh-host", versionFlag(behindV)...)
	oneAhead := buildProgramWith(t, "mesh-host", "../../cmd/mesh-host", versionFlag(aheadV)...)
	data, addr := t.TempDir(), freeAddr(t)
	cli(t, mc, data, "migrate")
	startProc(t, "controller "+controllerV.String(), mc, "--data", data, "serve", "--listen", addr).wait(t, 20*time.Second, readyLine, 0)
	url := "nats://" + addr
	spoken := fmt.Sprintf("(it speaks %s to %s)", behindV, aheadV)

	// Two minors behind: refused at join, in one line, the token unused.
	token := strings.TrimSpace(cli(t, mc, data, "token", "issue", "--new", "web1"))
	web1 := &meshHost{node: "web1", bin: oneBehind, state: filepath.Join(t.TempDir(), "state"), root: filepath.Join(t.TempDir(), "root")}
	join := exec.Command(twoBehind, "join", "--broker", url, "--token", token, "--node", "web1", "--state", web1.state)
	join.Env = withoutMesh()
	out, err := join.CombinedOutput()
	want := fmt.Sprintf("mesh-host: the host speaks protocol %s, this controller %s %s: upgrade the host\n", protocol.Version, controllerV, spoken)
	if exit, ok := err.(*exec.ExitError); !ok || exit.ExitCode() != 1 || string(out) != want {
		t.Fatalf("a host two minors behind joins: %v\n%s\nwant, exit 1: %s", err, out, want)
	}
	t.Logf("mesh-host %s join under a %s controller: %s", protocol.Version, controllerV, strings.TrimSpace(string(out)))

	// One behind, with the same token; one ahead, with its own.
	join = exec.Command(oneBehind, "join", "--broker", url, "--token", token, "--node", "web1", "--state", web1.state)
	join.Env = withoutMesh()
	if out, err := join.CombinedOutput(); err != nil {
		t.Fatalf("a host one minor behind, with the token the refused one presented: %v\n%s", err, out)
	}
	web1.start(t)
	joinHost(t, mc, oneAhead, data, url, "web2")
	body := filepath.Join(t.TempDir(), "body.json")
	if err := os.WriteFile(body, []byte(moduleBody("one", "/srv/one")), 0o600); err != nil {
		t.Fatal(err)
	}
	cli(t, mc, data, "declare", "web1", body, "--why", "a declaration for a host one minor behind")
	// At least: a node's plan also moves when a host's facts name a new
	// overlay key (its own or a peer's), and the catch-up declares it
	// again, as late as those facts are kept.
	heard := func(node, speaks string, applied int64) func() error {
		return func() error {
			n := showNode(t, mc, data, node)
			if n.Protocol != speaks || n.LastHeard == nil || n.SerialApplied < applied {
				return fmt.Errorf("%s: protocol %q, heard %v, applied %d; want %s heard, %d applied or later", node, n.Protocol, n.LastHeard, n.SerialApplied, speaks, applied)
			}
			return nil
		}
	}
	checkFor(t, settle, allOf(heard("web1", behindV.String(), 1), heard("web2", aheadV.String(), 0)))

	// web1 downgraded to this tree's host: two behind. What it applied
	// stays while it is not heard.
	web1.stop()
	applied := showNode(t, mc, data, "web1").SerialApplied
	web1.bin = twoBehind
	web1.start(t)
	mismatch := fmt.Sprintf("the host speaks protocol %s, this controller %s %s: upgrade the host", protocol.Version, controllerV, spoken)
	web1.proc.wait(t, settle, `msg="ask for the latest declaration: the controller refused this host: `+regexp.QuoteMeta(mismatch)+`; asking again"`, 0)
	cli(t, mc, data, "declare", "web1", body, "--why", "a declaration for a host two minors behind")
	web1.proc.wait(t, settle, `msg="report the outcome: not recorded: `+regexp.QuoteMeta(mismatch)+`"`, 0)
	checkFor(t, settle, func() error {
		n := showNode(t, mc, data, "web1")
		for _, d := range n.Dropped {
			if d.Reason == "protocol mismatch" && d.Count > 2 && n.Protocol == protocol.Version && n.SerialApplied == applied {
				return nil
			}
		}
		return fmt.Errorf("web1's messages are not dropped as protocol mismatches: %+v", n)
	})
	key := "node.protocol-mismatch/web1"
	cli(t, mc, data, "doctor", "run")
	var c struct {
		Summary  string `json:"summary"`
		Severity string `json:"severity"`
	}
	if err := json.Unmarshal([]byte(cli(t, mc, data, "conditions", "show", key, "--json")), &c); err != nil || c.Summary != "web1 is not heard: "+mismatch || c.Severity != "urgent" {
		t.Fatalf("%s: %+v, %v", key, c, err)
	}
	if list := cli(t, mc, data, "node", "list"); !regexp.MustCompile(`(?m)^web1 .*\(protocol ` + regexp.QuoteMeta(protocol.Version) + `\)$`).MatchString(list) {
		t.Errorf("node list does not say web1 speaks %s:\n%s", protocol.Version, list)
	}

	// Back on one behind: heard again, and the condition clears.
	web1.stop()
	web1.bin = oneBehind
	web1.start(t)
	checkFor(t, settle, heard("web1", behindV.String(), applied+1))
	cli(t, mc, data, "doctor", "run")
	if open := cli(t, mc, data, "conditions"); strings.Contains(open, key) {
		t.Fatalf("%s still open once web1 speaks %s:\n%s", key, behindV, open)
	}
}

// A declaration the controller signed in a newer major than the host
// reads (a controller with a bug, or one upgraded past its hosts) is
// refused by the host before it touches anything, and its report says so
// in one line; the applied serial stays.
func TestProtocol_NewerMajorDeclarationRefused(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	h := m.join("web1")
	d := m.declare("web1", moduleBody("one", "/srv/one"))
	checkFor(t, settle, m.applied("web1", d.Serial))
	before := roottest.Tree(t, h.root)

	ours, err := protocol.ParseVersion(protocol.Version)
	if err != nil {
		t.Fatal(err)
	}
	newer := protocol.Ver{Major: ours.Major + 1}.String()
	m.declareSigned(t, map[string]any{"node": "web1", "serial": 99, "protocol": newer, "issued_at": time.Now().UTC().Format(time.RFC3339),
		"modules": []any{map[string]any{"module": "two", "version": "2.0.0", "data": []any{map[string]any{"name": "d", "path": "/srv/two", "precious": "costly"}}}}})
	checkFor(t, settle, m.answered("web1", 99))
	n := m.node("web1")
	want := fmt.Sprintf("refused: declaration speaks protocol %s; this host reads %d.x: upgrade the host", newer, ours.Major)
	if n.LastApply.OK || n.LastApply.Error != want || n.SerialApplied != d.Serial {
		t.Fatalf("the newer major's declaration: %+v, applied %d; want %q, %d", n.LastApply, n.SerialApplied, want, d.Serial)
	}
	roottest.Unchanged(t, "", before, roottest.Tree(t, h.root))
}
