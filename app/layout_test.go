package app_test

import (
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
	"mesh-controller/contexts/inventory/manifest"
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

// contextOf is the context a package belongs to (inventory for
// mesh-controller/contexts/inventory/manifest), "" outside contexts/.
func contextOf(pkg string) string {
	rest, ok := strings.CutPrefix(pkg, "mesh-controller/contexts/")
	if !ok {
		return ""
	}
	name, _, _ := strings.Cut(rest, "/")
	return name
}

// Contexts never import each other, app or cmd (house rule 2): only app
// crosses contexts. A context's own subpackages (its model without its
// store, say) are its own.
func TestContextsImportNoOtherContext(t *testing.T) {
	for _, pkg := range goList(t, "./contexts/...") {
		for _, dep := range goList(t, "-deps", pkg) {
			if dep == pkg {
				continue
			}
			if (contextOf(dep) != "" && contextOf(dep) != contextOf(pkg)) ||
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

// What each package may not depend on (tailscale's deptest is the model):
// the controller never links the host agent, the planner and the wire
// protocol do no I/O of their own, and the embedded engines and the
// protocol know no context.
func TestLayout_Dependencies(t *testing.T) {
	deps := func(pkg string) map[string]bool {
		out := map[string]bool{}
		for _, d := range goList(t, "-deps", pkg) {
			out[d] = true
		}
		return out
	}
	bad := func(pkg string, why string, forbidden func(dep string) bool) {
		t.Helper()
		for d := range deps(pkg) {
			if d != pkg && forbidden(d) {
				t.Errorf("%s depends on %s: %s", pkg, d, why)
			}
		}
	}
	bad("mesh-controller/cmd/mesh-controller", "the controller never links the host agent",
		func(d string) bool { return d == "mesh-controller/app/host" })
	bad("mesh-controller/cmd/mesh-controller", "the overlay's interfaces are the hosts' (userspace WireGuard runs in mesh-host only)",
		func(d string) bool { return strings.HasPrefix(d, "golang.zx2c4.com/wireguard/device") })
	io := func(d string) bool {
		return d == "os" || d == "database/sql" || d == "net" || d == "net/http" || d == "os/exec" || d == "syscall" ||
			strings.HasPrefix(d, "github.com/nats-io/") || strings.HasPrefix(d, "modernc.org/") || strings.HasPrefix(d, "mesh-controller/embedded/")
	}
	// The planner reads the inventory's types and rules, whose package also
	// holds its store: what the planner itself imports is judged.
	for _, imp := range goList(t, "-f", `{{join .Imports " "}}`, "mesh-controller/app/plan") {
		if io(imp) {
			t.Errorf("mesh-controller/app/plan imports %s: a plan is a pure function of a snapshot", imp)
		}
	}
	bad("mesh-controller/app/nftables", "a filter is rendered here, applied by a host: no store, broker, network or process",
		func(d string) bool { return io(d) && d != "os" && d != "syscall" })
	bad("mesh-controller/app/boardsvg", "the board's pictures are drawn from what they are given: no store, broker, network or process",
		func(d string) bool { return io(d) && d != "os" && d != "syscall" })
	bad("mesh-controller/app/protocol", "messages are pure: no store, broker, network or process",
		func(d string) bool { return io(d) && d != "os" && d != "syscall" })
	for _, pkg := range append(goList(t, "./embedded/..."), "mesh-controller/app/protocol") {
		bad(pkg, "the embedded engines and the protocol know no context",
			func(d string) bool { return strings.HasPrefix(d, "mesh-controller/contexts/") })
	}
	bad("mesh-controller/app/daemon", "the daemon is scheduled by app, never the other way",
		func(d string) bool { return d == "mesh-controller/app" })
	// A builder, a host and a backup module keep no store: a context's root
	// package holds its store, its store-free subpackages (inventory's
	// manifest) are what they may read.
	store := func(d string) bool {
		return d == "database/sql" || strings.HasPrefix(d, "modernc.org/sqlite") || strings.HasPrefix(d, "github.com/jackc/pgx") ||
			strings.HasPrefix(d, "mesh-controller/embedded/sqlite") || strings.HasPrefix(d, "mesh-controller/embedded/postgres") ||
			(contextOf(d) != "" && d == "mesh-controller/contexts/"+contextOf(d))
	}
	for _, bin := range []string{"mesh-builder", "mesh-host", "mesh-backup"} {
		bad("mesh-controller/cmd/"+bin, "only the controller keeps stores: no store driver, no database/sql, no context's store", store)
	}
}

// One name rule: the inventory judges manifests by its own copy (a context
// imports no app package), which must say what the protocol says.
func TestNameRules_Agree(t *testing.T) {
	for _, n := range []string{"web1", "a", "db-2", strings.Repeat("a", 63), strings.Repeat("a", 64), "", "1web", "Web", "web_1", "web.1", "-a", "a b", "é"} {
		if protocol.ValidName(n) != inventory.ValidName(n) {
			t.Errorf("%q: protocol says %v, inventory %v", n, protocol.ValidName(n), inventory.ValidName(n))
		}
	}
}

// One prepare bound: what module check lets a manifest say of its
// prepare's timeout is what a host accepts in a declaration.
func TestPrepareBounds_Agree(t *testing.T) {
	if protocol.DefaultPrepareTimeout != manifest.DefaultPrepareTimeout || protocol.MinPrepareTimeout != manifest.MinPrepareTimeout ||
		protocol.MaxPrepareTimeout != manifest.MaxPrepareTimeout {
		t.Errorf("the protocol's prepare timeouts (%s, [%s, %s]) are not the manifest's (%s, [%s, %s])",
			protocol.DefaultPrepareTimeout, protocol.MinPrepareTimeout, protocol.MaxPrepareTimeout,
			manifest.DefaultPrepareTimeout, manifest.MinPrepareTimeout, manifest.MaxPrepareTimeout)
	}
}
