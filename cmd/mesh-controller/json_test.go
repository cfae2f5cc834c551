package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/nats-io/nkeys"

	"mesh-controller/app/apptest"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/builds"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/identity"
	"mesh-controller/contexts/inventory"
)

// snakeCase is what every key of every --json document is (house rule 8).
var snakeCase = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// listing is one command run with --json, and the paths in its document
// whose keys are data (names, settings contents), not field names.
type listing struct {
	args []string
	data []string
	// command is the command's path, e.g. "conditions list" for "conditions".
	command string
	// status is the exit status it must end with (module check finding
	// a problem exits 1, its document printed all the same).
	status int
}

// TestJSON_SnakeCase runs every command that offers --json against one real
// store, populated through the commands themselves (and, for what only a
// host reports, through the stores), and checks every key of every document
// is snake_case. It fails when a listing field has no json tag, and when a
// command gains --json without being listed here.
func TestJSON_SnakeCase(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("MESH_DATA", filepath.Join(dir, "data"))
	t.Setenv("HOME", filepath.Join(dir, "home"))
	examples, err := filepath.Abs("../../contexts/inventory/testdata")
	if err != nil {
		t.Fatal(err)
	}
	populate(t, dir, examples)
	// A manifest module check finds a problem in: its problems' keys.
	badManifest := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(badManifest, []byte(`{"module": "bad", "version": "1.0"}`), 0o600); err != nil {
		t.Fatal(err)
	}

	var conditions []health.Condition
	if err := json.Unmarshal([]byte(mc(t, "conditions", "--json")), &conditions); err != nil || len(conditions) == 0 {
		t.Fatalf("conditions --json: %v, %d conditions: the store should have open conditions", err, len(conditions))
	}
	listings := []listing{
		{args: []string{"identity", "show"}},
		{args: []string{"node", "list"}},
		{args: []string{"node", "show", "db1"}},
		{args: []string{"node", "public-domain", "db1"}},
		{args: []string{"node", "networks", "db1"}},
		{args: []string{"overlay", "show"}},
		{args: []string{"overlay", "place", "web2", "--site", "office"}},
		{args: []string{"converge", "db1", "--filter", "nftables"}},
		{args: []string{"broker", "show"}, data: []string{"trust.resolver_preload"}},
		{args: []string{"module", "list"}},
		{args: []string{"upgrade", "postgres"}},
		{args: []string{"upgrade"}},
		{args: []string{"module", "check", filepath.Join(examples, "postgres.json"), badManifest}, status: 1},
		{args: []string{"migrate"}},
		{args: []string{"version"}},
		{args: []string{"host", "release", "list"}},
		{args: []string{"host", "upgrade"}},
		{args: []string{"plan", "web2"}, data: []string{"reasons", "modules[].settings"}},
		{args: []string{"plan", "nas1"}, data: []string{"reasons", "modules[].settings"}},
		{args: []string{"operator", "key", "show"}},
		{args: []string{"licence", "list"}},
		{args: []string{"licence", "key", "translation"}},
		{args: []string{"status"}},
		{args: []string{"conditions"}},
		{args: []string{"conditions", "show", conditions[0].Key}},
		{args: []string{"conditions", "history"}},
		{args: []string{"doctor"}},
		{args: []string{"doctor", "run"}},
		{args: []string{"doctor", "probes"}},
		{args: []string{"doctor", "signals"}},
		{args: []string{"healers"}},
		{args: []string{"hand-acts"}},
		{args: []string{"durations"}},
		{args: []string{"seat", "list"}},
		{args: []string{"retire"}},
		{args: []string{"cleanup"}},
		{args: []string{"data"}},
		{args: []string{"build", "list"}},
		{args: []string{"build", "queue"}},
		{args: []string{"build", "plans"}},
		// A copy onto a new SQLite file: the same document as onto PostgreSQL.
		{args: []string{"store", "copy", "--to", "builds=" + filepath.Join(dir, "copy", "builds.db")}},
		// It changes the signing key (hosts would follow it).
		{args: []string{"identity", "rotate", "--why", "the json test"}},
		// Last: it changes the mesh (a node kept for it alone goes).
		{args: []string{"node", "remove", "spare", "--and-unassign", "--why", "the json test"}},
	}

	// Every command with a --json flag is listed above.
	parser, err := kong.New(&CLI{}, kongOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	ran := map[string]bool{}
	for i, l := range listings {
		kctx, err := parser.Parse(append(append([]string{}, l.args...), "--json"))
		if err != nil {
			t.Fatalf("%s --json: %v", strings.Join(l.args, " "), err)
		}
		listings[i].command = kctx.Selected().Path()
		ran[listings[i].command] = true
	}
	// prepare is migrate under the name the mesh asks modules to prepare
	// by: the same command and document.
	ran["prepare"] = true
	// collection reads the serving controller's broker: its document's
	// keys are checked where a controller serves (app, TestCollection_…).
	ran["collection"] = true
	// host release add puts the archive in the serving controller's broker:
	// its document's keys are checked where a controller serves (app/e2e,
	// TestHostUpgrade_…).
	ran["host release add"] = true
	// take looks at a node's host live: its documents' keys are checked
	// where a host answers (app, TestTake_AdoptedNode).
	ran["take"] = true
	// data backup, snapshots, restore and verify ask the backup seat's
	// holder: their documents' keys are checked where a real holder
	// answers (app, TestBackups_EndToEnd).
	for _, c := range []string{"data backup", "data snapshots", "data restore", "data verify"} {
		ran[c] = true
	}
	for _, path := range jsonCommands(parser.Model.Node) {
		if !ran[path] {
			t.Errorf("%s offers --json but this test does not run it: add it to the listings", path)
		}
	}

	w := &keyWalker{filled: map[string]bool{}}
	for _, l := range listings {
		name := strings.Join(l.args, " ") + " --json"
		out := mcExits(t, l.status, append(l.args, "--json")...)
		dec := json.NewDecoder(strings.NewReader(out))
		dec.UseNumber()
		var doc any
		if err := dec.Decode(&doc); err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if _, err := dec.Token(); !errors.Is(err, io.EOF) {
			t.Errorf("%s: more than one JSON document on stdout", name)
		}
		w.name, w.command, w.data = name, l.command, l.data
		w.walk(t, "", doc)
	}
	// An array that is empty in every document checks none of its
	// elements' keys: populate the store so that each holds something.
	var empty []string
	for path, filled := range w.filled {
		if !filled {
			empty = append(empty, path)
		}
	}
	sort.Strings(empty)
	for _, p := range empty {
		t.Errorf("%s is empty: its elements' keys are not checked; populate the store so that it holds something", p)
	}
}

// populate fills a store through the commands, and writes what only a host
// reports (facts, data sets, apply outcomes, heartbeats) and what only the
// daemon records (durations, healer acts, the brake) through the stores.
func populate(t *testing.T, dir, examples string) {
	t.Helper()
	settings := filepath.Join(dir, "settings.json")
	if err := os.WriteFile(settings, []byte(`{"workers": 3}`), 0o600); err != nil {
		t.Fatal(err)
	}
	mc(t, "migrate")
	mc(t, "operator", "key", "set", operatorKey)
	for _, m := range []string{"postgres", "paperless", "backup", "builder"} {
		mc(t, "module", "add", filepath.Join(examples, m+".json"))
	}
	for _, n := range []string{"db1", "web1", "web2", "nas1", "spare"} {
		mc(t, "node", "add", n)
	}
	mc(t, "token", "issue", "--node", "db1")
	web2Token := strings.TrimSpace(mc(t, "token", "issue", "--node", "web2"))
	mc(t, "assign", "db1", "postgres")
	mc(t, "assign", "web1", "paperless")
	mc(t, "assign", "web2", "paperless")
	mc(t, "assign", "nas1", "backup")
	mc(t, "assign", "spare", "builder", "paperless") // holds the build seat, keeps data
	mc(t, "unassign", "spare", "paperless")
	mc(t, "cleanup", "delete", "spare", "paperless", "index", "--why", "asked, never done: its removal cancels it")
	mc(t, "settings", "set", "paperless", settings, "--node", "web2")
	mc(t, "seat", "rename", "backup", "vault")
	mc(t, "module", "moved", "paperless", "abc123")
	mc(t, "unassign", "web1", "paperless") // a retired data set, and db1/postgres waits to retire web1's
	mc(t, "node", "public-domain", "db1", "example.org")
	mc(t, "node", "networks", "db1", "10.20.0.0/16", "2001:db8::/48")
	// postgres 16.5.0 registered: db1 runs an older version (upgrade shows it).
	pg, err := os.ReadFile(filepath.Join(examples, "postgres.json"))
	if err != nil {
		t.Fatal(err)
	}
	newer := filepath.Join(dir, "postgres-16.5.json")
	if err := os.WriteFile(newer, bytes.ReplaceAll(pg, []byte(`"16.4.0"`), []byte(`"16.5.0"`)), 0o600); err != nil {
		t.Fatal(err)
	}
	mc(t, "module", "add", newer)
	mc(t, "hand-acts", "record", "restarted the switch", "--why", "it hung", "--cause", "network")
	mc(t, "hand-acts", "record", "restarted the switch again", "--why", "it hung again", "--cause", "network")

	ctx := context.Background()
	c := apptest.New(os.Getenv("MESH_DATA"))
	defer c.Close()
	st, err := c.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	long := now.Add(-time.Hour)
	inv, hs := st.Inventory, st.Health
	backup := long
	// A roll-out rolled back, as serve would have left it: upgrade --json shows it.
	if err := inv.StartRollOut(ctx, inventory.RollOut{ID: "r1", Module: "postgres", To: "16.5.0", Canary: 1, Batch: "1", Wait: time.Minute,
		Phase: inventory.RollOutRolledBack, Why: "1 node failed", Nodes: []inventory.RollOutNode{{Node: "db1", From: "16.4.0", Moved: true, Serial: 2,
			Result: "failed", Error: "failed there", Back: "returned", BackSerial: 3, Detail: "data kept (no prepare ran)"}}}, now); err != nil {
		t.Fatal(err)
	}
	hostKey, _, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	user, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	nkey, err := user.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	// Builds: one failed with the manifest's problems, one waiting.
	bs := st.Builds
	failed, err := bs.Enqueue(ctx, builds.Ask{ID: builds.NewID(long), Repository: "https://git.example/paperless", Ref: "main"}, long)
	if err == nil {
		_, err = bs.Take(ctx, failed.ID, "db1/builder", long)
	}
	if err == nil {
		_, err = bs.Finish(ctx, failed.ID, builds.Outcome{Failed: true, Module: "paperless", Commit: strings.Repeat("c", 40), Why: "mesh.json does not stand",
			Problems: []string{"version: missing"}, LogTail: []string{"cloning"}}, now)
	}
	if err == nil {
		_, err = bs.Enqueue(ctx, builds.Ask{ID: builds.NewID(now), Repository: "https://git.example/smtp-relay"}, now)
	}
	if err == nil {
		_, err = bs.MakePlan(ctx, builds.Plan{Kind: builds.KindOn, Base: "postgres", Steps: []builds.Step{
			{Module: "paperless", Repository: "https://git.example/paperless", Ref: strings.Repeat("c", 40)},
			{Module: "backup", Repository: "https://git.example/backup", Bases: []string{"paperless"}}}}, now)
	}
	if err != nil {
		t.Fatal(err)
	}
	// web2 joins as its host would: its keys kept, its token used.
	_, joinErr := st.Identity.Join(ctx, web2Token, identity.Host{Node: "web2", HostKey: hostKey, AgeRecipient: operatorKey, NKey: nkey, HostVersion: "test"}, now)
	steps := []error{
		joinErr,
		// a controller standing by, heard until an hour from now
		st.Identity.StandBy(ctx, identity.Standby{Holder: "standby", PID: 4242, Host: "other", Since: now, ExpiresAt: time.Now().Add(time.Hour)}),
		inv.MarkJoined(ctx, "web2", now),
		inv.MarkJoined(ctx, "db1", long),
		inv.RecordBeats(ctx, []inventory.Beat{{Node: "db1", HeardAt: long, IntervalS: 15, SerialApplied: 1, UptimeS: 60,
			Applying: &inventory.Applying{Serial: 3, Since: long, Phase: "archives"}, HostVersion: "v0.3.0"}}),
		// Host releases, one run on db1 and declared to web2, as 'host
		// release add' and a host upgrade would have left them.
		hostRelease(ctx, inv, "v0.3.0", now),
		hostRelease(ctx, inv, "v0.3.1", now),
		inv.Apply(ctx, inventory.Change{HostReleases: []inventory.NodeHostRelease{{Node: "web2", Version: "v0.3.1"}}}, now),
		facts(inv.RecordFacts(ctx, "db1", []inventory.Fact{{Name: "arch", Value: "amd64", Why: "uname -m"},
			{Name: protocol.FactWireGuardKey, Value: "PQgYbFGLUB9b7UOnSVANK4FEdbwJx1UzXSydpgMQs5U=", Why: "wg pubkey"}},
			[]inventory.Found{{Kind: "service", Name: "nginx", Detail: "listens on :80"},
				{Kind: "port", Name: "tcp/6379", Detail: "redis", Addresses: []string{"0.0.0.0"}, Commands: []string{"redis-server"}},
				{Kind: "port", Name: "tcp/631", Detail: "cups", Addresses: []string{"127.0.0.1"}, Commands: []string{"cupsd"}}}, now)),
		inv.RecordOutcome(ctx, "db1", inventory.Outcome{Serial: 2, OK: false, Error: "disk full", TotalMS: 12, At: now}),
		inv.RecordDataSets(ctx, "db1", []inventory.DataSet{{Module: "postgres", Name: "data", Path: "/var/lib/postgresql",
			Bytes: 4096, Precious: "irreplaceable", LastBackup: &backup}}, now),
		hs.CountDrops(ctx, "db1", "bad signature", 2, now),
		facts(inv.RecordFacts(ctx, "web2", []inventory.Fact{{Name: protocol.FactWireGuardKey, Value: "m3mapGBXZdz2eBKeGszGRMOQMbWN0SL9sUkjMnARZGU=", Why: "wg pubkey"}}, nil, now)),
		placed(ctx, inv, "db1", inventory.Placement{Endpoint: "203.0.113.1:51820", Reach: inventory.Public}),
		placed(ctx, inv, "web2", inventory.Placement{Reach: inventory.BehindNAT, Site: "home"}),
		hs.RecordDurations(ctx, []health.Duration{{Kind: "apply", Subject: "db1", MS: 12, At: now}, {Kind: "start", Subject: "db1/postgres", MS: 900, At: now}}),
		hs.RecordModuleStates(ctx, map[string][]health.ModuleState{"db1": {{Node: "db1", Module: "postgres", Version: "16.4.0", State: "crash-looping",
			Serial: 1, Since: now, Restarts1h: 7, LastExit: "exit status 1", Detail: "keeps exiting", LogTail: []string{"FATAL: no data dir"}, HeardAt: now}}}),
		hs.RecordHealerAct(ctx, health.HealerAct{Healer: "restart", Subject: "db1", Detail: "restarted postgres", Outcome: "done", At: now}),
		hs.EngageBrake(ctx, "too many restarts", now),
	}
	if err := errors.Join(steps...); err != nil {
		t.Fatal(err)
	}
	c.Close()

	mc(t, "secret", "accept", "web2", "paperless", "ocr_licence", "--from", settings)
	opKey := filepath.Join(dir, "op.key")
	if err := os.WriteFile(opKey, []byte(operatorIdentity+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	translator := filepath.Join(dir, "translator.json")
	if err := os.WriteFile(translator, []byte(`{"module": "translator", "version": "1.0.0", "licences": [{"name": "translation"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	mc(t, "module", "add", translator)
	mc(t, "assign", "web2", "translator") // needs the licence, and does not hold it
	mc(t, "licence", "add", "translation", "--provider", "deepl", "--from", settings, "--expires", "720h")
	mc(t, "licence", "use", "translation", "web2/paperless", "--key", opKey)
	mc(t, "doctor", "run") // raises conditions; the listing's doctor run finds them changed or not
	var open []health.Condition
	if err := json.Unmarshal([]byte(mc(t, "conditions", "--json")), &open); err != nil || len(open) == 0 {
		t.Fatalf("no open condition to silence: %v", err)
	}
	mc(t, "conditions", "silence", open[0].Key, "--for", "1h", "--why", "known")
}

// operatorIdentity is operatorKey's private half: licence use opens the
// licence's operator copy with it.
const operatorIdentity = "AGE-SECRET-KEY-1HFLZ9G0DW9Z27WWPQ0V9FXT9PJLACNFPUFDLRU24WQVAN45GGLWSHX88M8"

// operatorKey is an age public key; the test never opens what is sealed to it.
const operatorKey = "age1qw9z92zmyjj7ef5qdauyxtg2t7qeanlwt0wsencparm9fryhkdcqyh25r9"

// mc runs the command line in this process and returns its stdout; it must exit 0.
func mc(t *testing.T, args ...string) string {
	t.Helper()
	return mcExits(t, 0, args...)
}

// mcExits is mc for a command that must exit with status.
func mcExits(t *testing.T, status int, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := run(args, &stdout, &stderr); code != status {
		t.Fatalf("mesh-controller %s: exit %d, want %d: %s", strings.Join(args, " "), code, status, stderr.String())
	}
	return stdout.String()
}

// jsonCommands are the paths of every command with a --json flag, but
// not of a former spelling (hidden, and the same command as its new one).
func jsonCommands(n *kong.Node) []string {
	if n.Hidden && (n.Parent == nil || n.Parent.DefaultCmd != n) {
		return nil
	}
	var out []string
	for _, f := range n.Flags {
		if f.Name == "json" {
			out = append(out, n.Path())
		}
	}
	for _, c := range n.Children {
		out = append(out, jsonCommands(c)...)
	}
	return out
}

// keyWalker checks every key of one document, and remembers which arrays
// held something in any document.
type keyWalker struct {
	name, command string
	data          []string
	// filled is, per command and array, whether any document had something in it.
	filled map[string]bool
}

func (w *keyWalker) walk(t *testing.T, path string, v any) {
	t.Helper()
	for _, d := range w.data {
		if path == d {
			return
		}
	}
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if !snakeCase.MatchString(k) {
				t.Errorf("%s: key %q at %s is not snake_case: give the field a json tag", w.name, k, orRoot(path))
			}
			next := k
			if path != "" {
				next = path + "." + k
			}
			w.walk(t, next, e)
		}
	case []any:
		key := w.command + " --json: " + path + "[]"
		w.filled[key] = w.filled[key] || len(v) > 0
		for _, e := range v {
			w.walk(t, path+"[]", e)
		}
	}
}

func orRoot(path string) string {
	if path == "" {
		return "the top"
	}
	return path
}

// placed places a node on the overlay, moving no plan.
func placed(ctx context.Context, inv *inventory.Store, node string, p inventory.Placement) error {
	_, err := inv.SetPlacement(ctx, node, p, func(_, _ inventory.Overlay) []string { return nil })
	return err
}

// facts is RecordFacts' error: the keys recorded here are each one node's.
func facts(_ *inventory.KeyRefusal, err error) error { return err }

// hostRelease keeps a host release of version, as 'host release add' does.
func hostRelease(ctx context.Context, inv *inventory.Store, version string, now time.Time) error {
	_, err := inv.AddHostRelease(ctx, inventory.HostRelease{Version: version, Archive: inventory.Archive{Digest: strings.Repeat("a", 63) + version[len(version)-1:],
		Bytes: 1 << 20, UnpackedBytes: 3 << 20}, OS: "linux", Arch: "amd64"}, now)
	return err
}
