package plan

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/diff"

	"mesh-controller/contexts/inventory"
)

// update rewrites the golden files with what the planner computes now:
// go test ./app/plan -run TestPlan_Golden -update, then read the diff.
var update = flag.Bool("update", false, "rewrite testdata/*.golden with the plans computed now")

// at is when everything in these meshes happened.
var at = time.Date(2026, 11, 2, 9, 30, 0, 0, time.UTC)

// The manifests the meshes run, as module add reads them.
const (
	postgresManifest = `{"module": "postgres", "version": "16.4.0",
		"run": {"command": ["bin/postgres", "-D", "/var/lib/postgres/data"]},
		"ports": [{"name": "sql", "port": 5432, "expose": "overlay"}],
		"provides": [{"provision": "postgres", "port": 5432,
			"per_consumer": {"credential": true, "data": {"keeps": "the consumer's database", "precious": "irreplaceable"}}}],
		"secrets": [{"name": "superuser_password", "made_by": "mesh"}],
		"prepare": {"command": ["bin/pg_upgrade-cluster"], "timeout": "30m"},
		"data": [{"name": "cluster", "path": "/var/lib/postgres/data", "precious": "irreplaceable", "backup": "daily"}]}`
	paperlessManifest = `{"module": "paperless", "version": "2.14.1",
		"requires": {"arch": ["amd64"], "memory_mb": 1024},
		"run": {"command": ["bin/paperless", "serve"], "env": {"PAPERLESS_WORKERS": "${settings.workers}", "PAPERLESS_OCR": "${settings.language}"}},
		"ports": [{"name": "http", "port": 8000, "expose": "overlay"}],
		"needs": [{"provision": "postgres"}, {"provision": "smtp", "optional": true}],
		"settings": {"schema": {"type": "object", "properties": {"workers": {"type": "integer", "minimum": 1}, "language": {"type": "string"}}, "additionalProperties": false},
			"defaults": {"workers": 2, "language": "eng"}},
		"secrets": [{"name": "admin_password", "made_by": "mesh"}, {"name": "ocr_licence", "made_by": "person"}],
		"data": [{"name": "media", "path": "/var/lib/paperless/media", "precious": "irreplaceable", "backup": {"every": "hourly", "before": ["bin/paperless", "flush"], "keep": {"daily": 14}}},
			{"name": "index", "path": "/var/lib/paperless/index", "precious": "rebuildable"}]}`
	siteManifest = `{"module": "site", "version": "1.0.0",
		"run": {"command": ["bin/site"], "ready": {"port": "http"}},
		"ports": [{"name": "http", "port": 8080, "expose": "public"}, {"name": "metrics", "port": 9100, "expose": "overlay"}]}`
	translatorManifest = `{"module": "translator", "version": "0.3.0",
		"run": {"command": ["bin/translator"]},
		"licences": [{"name": "deepl"}, {"name": "glossary"}]}`
	backupManifest = `{"module": "backup", "version": "1.2.0",
		"run": {"command": ["bin/backup", "daemon"]},
		"ports": [{"name": "rest", "port": 8100, "expose": "overlay"}],
		"seats": [{"seat": "backup", "delivers": "copies of every precious data set, on its cadence", "replicated": false}],
		"secrets": [{"name": "repository_password", "made_by": "person"}],
		"data": [{"name": "repository", "path": "/srv/backup/repository", "precious": "irreplaceable", "backup": "weekly"}]}`
)

// wgKey is a stand-in WireGuard public key: 32 bytes, base64, one a name.
func wgKey(name string) string {
	sum := sha256.Sum256([]byte("wg " + name))
	return base64.StdEncoding.EncodeToString(sum[:])
}

// snapshot is a mesh as the inventory store reads it for planning: nodes,
// the manifests registered (each version current), and what is assigned
// where (by node, then module, as the store orders them).
func snapshot(t *testing.T, nodes []inventory.NodeState, manifests []string, assignments ...inventory.Assignment) *inventory.Snapshot {
	t.Helper()
	s := &inventory.Snapshot{Revision: 7, Nodes: map[string]inventory.NodeState{}, Manifests: map[string]map[string]inventory.Manifest{},
		Archives: map[string]inventory.Archive{}, Current: map[string]string{}, Assignments: assignments,
		Settings: map[string]map[string]json.RawMessage{}, Routing: map[string]inventory.Routing{}, Filters: map[string]inventory.Filter{},
		Seats: inventory.SeatState{Holders: map[string][]inventory.Holder{}, Aliases: map[string]string{}, Bindings: map[string]inventory.Binding{},
			Pins: map[string]inventory.Pin{}, Backups: map[string]time.Time{}, BackupStates: map[string]inventory.BackupState{}, Access: map[string]inventory.BackupAccess{}}}
	for _, n := range nodes {
		s.Nodes[n.Name] = n
		s.NodeNames = append(s.NodeNames, n.Name)
	}
	for _, doc := range manifests {
		m, problems := inventory.ParseManifest([]byte(doc))
		if len(problems) > 0 {
			t.Fatalf("manifest %.40s…: %v", doc, problems)
		}
		s.Manifests[m.Module] = map[string]inventory.Manifest{m.Version: m}
		s.Current[m.Module] = m.Version
	}
	return s
}

// joined is a converged node whose host joined and applied its plan.
func joined(name string, mode inventory.Mode) inventory.NodeState {
	heard := at.Add(time.Minute)
	return inventory.NodeState{Name: name, Mode: mode, Joined: true, PlanVersion: 3, DeclaredPlanVersion: 3, SerialDeclared: 4, SerialApplied: 4,
		LastHeard: &heard, HeartbeatIntervalS: 10}
}

func assigned(node, module, version string) inventory.Assignment {
	return inventory.Assignment{Node: node, Module: module, Version: version, AssignedAt: at}
}

// A planner's input and the nodes whose plans the golden file holds.
type goldenCase struct {
	name  string
	nodes []string
	pl    func(t *testing.T) *Planner
}

var goldenCases = []goldenCase{
	{
		// A converged node running a consumer bound to a provider on
		// another node, a public site, and a module holding one licence
		// and waiting for another: settings layered (mesh, then node), run
		// env filled in from them, ports, an archive, secrets sealed and
		// one waiting for a person, the module's broker user, its routing.
		name:  "converged",
		nodes: []string{"web1"},
		pl: func(t *testing.T) *Planner {
			web1 := assigned("web1", "paperless", "2.14.1")
			web1.Unverified = []string{"arch"}
			s := snapshot(t, []inventory.NodeState{joined("db1", inventory.Converged), joined("web1", inventory.Converged)},
				[]string{postgresManifest, paperlessManifest, siteManifest, translatorManifest},
				assigned("db1", "postgres", "16.4.0"), web1, assigned("web1", "site", "1.0.0"), assigned("web1", "translator", "0.3.0"))
			s.Settings["paperless"] = map[string]json.RawMessage{"": json.RawMessage(`{"language": "deu+eng"}`), "web1": json.RawMessage(`{"workers": 4}`)}
			s.Archives["site@1.0.0"] = inventory.Archive{Digest: "sha256:5173e1", Bytes: 4 << 20, UnpackedBytes: 11 << 20}
			s.Routing["web1"] = inventory.Routing{PublicDomain: "example.org", Networks: []string{"10.20.0.0/16", "2001:db8::/48"}}
			s.Seats.Bindings[inventory.BindingKey("web1", "paperless", "postgres")] = inventory.Binding{Node: "web1", Module: "paperless", Provision: "postgres",
				Provider: inventory.Holder{Node: "db1", Module: "postgres"}, Since: at.Add(-48 * time.Hour)}
			sealed := map[string]Sealed{
				"web1/paperless/admin_password": {Name: "admin_password", Version: 1, Sealed: "age-sealed-admin-password"},
				"db1/postgres/" + inventory.CredentialName("web1", "paperless", "postgres"): {Name: inventory.CredentialName("web1", "paperless", "postgres"),
					Version: 2, Sealed: "age-sealed-postgres-credential"},
			}
			return New(s, sealed).WithCreds(map[string]string{"web1/paperless": "age-sealed-paperless-broker-user"}).
				WithLicences(map[string][]Sealed{"web1/translator": {{Name: "deepl", Version: 3, Sealed: "age-sealed-deepl"}}})
		},
	},
	{
		// An adopted node: a module taken onto it from what ran there (a
		// unit and a process the host stops at the cutover), beside one
		// assigned plainly; a setting that breaks the schema is a problem.
		name:  "adopted",
		nodes: []string{"legacy1"},
		pl: func(t *testing.T) *Planner {
			taken := assigned("legacy1", "site", "1.0.0")
			taken.Taken = &inventory.Take{Digest: "c0ffee12ab34", At: at, From: []string{"tcp/8080 on 0.0.0.0 held by pid 812 (nginx)"},
				Units: []string{"nginx.service"}, Processes: []inventory.TakeProcess{{Pid: 812, Command: "nginx"}}}
			s := snapshot(t, []inventory.NodeState{joined("legacy1", inventory.Adopted)}, []string{paperlessManifest, siteManifest, postgresManifest},
				assigned("legacy1", "paperless", "2.14.1"), taken)
			s.Settings["paperless"] = map[string]json.RawMessage{"legacy1": json.RawMessage(`{"workers": 0}`)}
			return New(s, nil)
		},
	},
	{
		// Seats and provisions: db1 provides postgres (a version with a
		// prepare, allowed by its roll-out without a snapshot) to two consumers
		// (one bound and sealed, one retired with its database kept), nas1
		// holds the backup seat and is given every precious data set's
		// line, with what was backed up and verified; the holder is reached
		// at the address its settings give.
		name:  "seats",
		nodes: []string{"db1", "nas1", "web1"},
		pl: func(t *testing.T) *Planner {
			s := snapshot(t, []inventory.NodeState{joined("db1", inventory.Converged), joined("nas1", inventory.Converged), joined("web1", inventory.Converged)},
				[]string{postgresManifest, paperlessManifest, backupManifest},
				assigned("db1", "postgres", "16.4.0"), assigned("nas1", "backup", "1.2.0"), assigned("web1", "paperless", "2.14.1"))
			s.Settings["backup"] = map[string]json.RawMessage{"": json.RawMessage(`{"address": "nas1.lan"}`)}
			backup := inventory.Holder{Node: "nas1", Module: "backup"}
			pg := inventory.Holder{Node: "db1", Module: "postgres"}
			s.Seats.Holders["backup"] = []inventory.Holder{backup}
			s.Seats.Consumers = []inventory.Consumer{
				{Provider: pg, Consumer: "web1/paperless", Provision: "postgres", State: "active", Since: at},
				{Provider: pg, Consumer: "web2/wiki", Provision: "postgres", State: "retired", Since: at, Why: "unassigned by a person"},
			}
			s.Seats.Backups["db1/postgres/cluster"] = at.Add(-2 * time.Hour)
			verified := at.Add(-26 * time.Hour)
			s.Seats.BackupStates["db1/postgres/cluster"] = inventory.BackupState{VerifiedAt: &verified}
			s.Seats.Access["db1"] = inventory.BackupAccess{Holder: "nas1", Sealed: "age-sealed-db1-access", IssuedAt: at}
			s.Seats.Access["web1"] = inventory.BackupAccess{Holder: "nas0", Sealed: "age-sealed-by-a-former-holder", IssuedAt: at}
			// A roll-out a person allowed to prepare 16.4.0 without a snapshot.
			s.WithoutSnapshot = map[inventory.Holder]string{pg: "16.4.0"}
			cred := inventory.CredentialName("web1", "paperless", "postgres")
			sealed := map[string]Sealed{"db1/postgres/" + cred: {Name: cred, Version: 1, Sealed: "age-sealed-postgres-credential"}}
			return New(s, sealed).WithRecipients(map[string]string{"db1": "age1db1", "web1": "age1web1"})
		},
	},
	{
		// Overlay peers: two public nodes and one behind NAT. The first
		// public node by name relays; the one behind NAT dials it, and
		// reaches the other through it. A node with no key yet gets none.
		name:  "overlay",
		nodes: []string{"home1", "pub1", "pub2", "nokey"},
		pl: func(t *testing.T) *Planner {
			names := []string{"home1", "nokey", "pub1", "pub2"}
			var nodes []inventory.NodeState
			for _, n := range names {
				nodes = append(nodes, joined(n, inventory.Converged))
			}
			s := snapshot(t, nodes, nil)
			s.Overlay = inventory.Overlay{Prefix6: "fd12:3456:789a::/48", Nodes: []inventory.OverlayNode{
				{Name: "home1", Index: 3, Key: wgKey("home1"), Placement: inventory.Placement{Reach: inventory.BehindNAT, Site: "home"}},
				{Name: "nokey", Index: 4, Placement: inventory.Placement{Reach: inventory.Public, Endpoint: "203.0.113.4:51820"}},
				{Name: "pub1", Index: 1, Key: wgKey("pub1"), Placement: inventory.Placement{Reach: inventory.Public, Endpoint: "203.0.113.1:51820"}},
				{Name: "pub2", Index: 2, Key: wgKey("pub2"), Placement: inventory.Placement{Reach: inventory.Public, Endpoint: "[2001:db8::2]:51820"}},
			}}
			return New(s, nil)
		},
	},
	{
		// Data sets: a node's precious data backed up to a holder reached
		// at its overlay address (its manifest's rest port) of a backup
		// seat since renamed, a data set retired and still backed up, one
		// retired rebuildable (not), and deletions a person asked for.
		name:  "data",
		nodes: []string{"nas1", "web1"},
		pl: func(t *testing.T) *Planner {
			s := snapshot(t, []inventory.NodeState{joined("nas1", inventory.Converged), joined("web1", inventory.Converged)},
				[]string{paperlessManifest, backupManifest},
				assigned("nas1", "backup", "1.2.0"), assigned("web1", "paperless", "2.14.1"))
			s.Seats.Holders["copies"] = []inventory.Holder{{Node: "nas1", Module: "backup"}}
			s.Seats.Aliases["backup"] = "copies"
			s.Seats.Retired = []inventory.Retirement{
				{ID: 1, Node: "web1", Module: "wiki", DataSet: "pages", Path: "/srv/wiki/pages", Precious: "costly", State: "retired", RetiredAt: at},
				{ID: 2, Node: "web1", Module: "wiki", DataSet: "cache", Path: "/srv/wiki/cache", Precious: "rebuildable", State: "retired", RetiredAt: at},
			}
			s.Seats.Deletions = []inventory.Deletion{
				{ID: 5, Node: "web1", Module: "wiki", Target: "cache", Kind: "data", Path: "/srv/wiki/cache", AskedAt: at, Why: "rebuildable"},
				{ID: 6, Node: "web1", Module: "postgres", Target: "db2/wiki", Kind: "consumer", AskedAt: at, Why: "the wiki is gone"},
			}
			s.Overlay = inventory.Overlay{Prefix6: "fd12:3456:789a::/48", Nodes: []inventory.OverlayNode{
				{Name: "nas1", Index: 1, Key: wgKey("nas1"), Placement: inventory.Placement{Reach: inventory.Public, Endpoint: "192.0.2.10:51820"}},
				{Name: "web1", Index: 2, Key: wgKey("web1"), Placement: inventory.Placement{Reach: inventory.Public, Endpoint: "192.0.2.11:51820"}},
			}}
			return New(s, nil)
		},
	},
}

// The planner's output for representative meshes, compared with what was
// read and checked in (testdata/NAME.golden): each node's plan as JSON,
// with the backup holder the plans saw. A change to what the planner
// computes fails here until the golden files are rewritten (-update) and
// the diff read.
func TestPlan_Golden(t *testing.T) {
	for _, c := range goldenCases {
		t.Run(c.name, func(t *testing.T) {
			pl := c.pl(t)
			plans := map[string]Plan{}
			for _, n := range c.nodes {
				p, err := pl.Plan(n)
				if err != nil {
					t.Fatalf("plan %s: %v", n, err)
				}
				plans[n] = p
			}
			got, err := json.MarshalIndent(struct {
				Plans  map[string]Plan
				Backup BackupHolder
			}{plans, pl.Backup()}, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			// Computed twice, a plan is the same bytes.
			again, _ := c.pl(t).Plan(c.nodes[0])
			if a, b := mustJSON(t, again), mustJSON(t, plans[c.nodes[0]]); !bytes.Equal(a, b) {
				t.Errorf("%s planned twice differs:\n%s\n%s", c.nodes[0], a, b)
			}
			file := filepath.Join("testdata", c.name+".golden")
			if *update {
				if err := os.WriteFile(file, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(file)
			if err != nil {
				t.Fatalf("%v (go test -run TestPlan_Golden -update writes it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("the plans differ from %s (go test ./app/plan -run TestPlan_Golden -update rewrites it; read the diff):\n%s", file, diff.Diff(file, want, "planned", got))
			}
		})
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
