package e2e

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh-controller/app"
	"mesh-controller/app/protocol"
	"mesh-controller/embedded/sqlite"
)

// logRecords is the daemon's JSON log, each line decoded; a line that is
// not one JSON object fails the test.
func logRecords(t *testing.T, logs string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.Lines(logs) {
		var r map[string]any
		d := json.NewDecoder(strings.NewReader(line))
		d.UseNumber()
		if err := d.Decode(&r); err != nil {
			t.Fatalf("a log line is not a JSON object (%v): %q", err, line)
		}
		for _, k := range []string{"time", "level", "msg"} {
			if _, ok := r[k].(string); !ok {
				t.Fatalf("a log line without %s: %q", k, line)
			}
		}
		out = append(out, r)
	}
	return out
}

// record is the first record with msg whose attributes hold each of want
// (compared as printed), nil if none.
func record(rs []map[string]any, msg string, want map[string]string) map[string]any {
	for _, r := range rs {
		if r["msg"] != msg {
			continue
		}
		match := true
		for k, v := range want {
			if got, ok := r[k]; !ok || jsonText(got) != v {
				match = false
			}
		}
		if match {
			return r
		}
	}
	return nil
}

func jsonText(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// serve --log-format json: every line of the daemon's log is one JSON
// object (time, level, msg); it begins with the serving line (version,
// pid, the broker's URL, the data directory, each store's location); each
// event carries its subject as attributes (a join and an apply their node
// and serial, an alert its condition and severity, a drop its subject and
// reason); and a secret accepted and delivered meanwhile is in no line, in
// no encoding. With the stores on PostgreSQL (MESH_TEST_POSTGRES) the start
// line shows their URLs without the password.
func TestServeLog_JSONWithSubjects(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	m.stop()
	m.logs = &syncBuffer{} // the first start's is text
	m.opts = app.ServeOptions{LogFormat: "json", Version: "v0.0.0-logtest", CheckEvery: 50 * time.Millisecond, Bounds: silentBounds}
	m.start()
	ctx := context.Background()
	web1, db1 := m.join("web1"), m.join("db1")
	for _, n := range []string{"paperless", "postgres"} {
		m.addModule(example(n))
	}
	m.assign(t, "db1", "postgres")
	// Applied before web1's assign moves db1's plan again (binding web1's
	// needs to it): a host that was not listening yet when declaration 1
	// was pushed asks, and could be answered 2.
	checkFor(t, settle, m.appliedFrom("db1", 1))
	m.assign(t, "web1", "paperless")
	value, encodings := knownValue(t)
	if _, err := m.c.SecretAccept(ctx, "web1", "paperless", "ocr_licence", protocol.NewSecret([]byte(value))); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(web1.root, "etc/mesh/modules/paperless/secrets/ocr_licence")
	checkFor(t, settle, allOf(fileHolds(secret, value), m.notBehind("web1")))
	// An alert raised: db1 silent, once its heartbeat's interval is known
	// (the bound is a multiple of it).
	checkFor(t, settle, m.beating("db1"))
	db1.stop()
	checkFor(t, settle, m.logSays(`"condition":"node.silent/db1"`))
	m.stop()

	logs := m.logs.String()
	rs := logRecords(t, logs)
	start := rs[0]
	if start["msg"] != "serving" || start["version"] != "v0.0.0-logtest" || jsonText(start["pid"]) != jsonText(os.Getpid()) ||
		start["broker"] != "embedded" || start["broker_url"] != m.url || start["data"] != m.c.DataDir {
		t.Fatalf("the first line is not the serving line with what, where and which stores: %v", start)
	}
	stores, _ := start["stores"].(map[string]any)
	for _, name := range app.Contexts {
		loc, _ := stores[name].(string)
		if loc == "" {
			t.Fatalf("the serving line does not say where the %s store is: %v", name, start)
		}
		if at, err := sqlite.Locate(name, m.c.DataDir, m.c.Getenv); err == nil {
			if u, err := url.Parse(at.DSN); err == nil && u.User != nil {
				if pw, ok := u.User.Password(); ok && strings.Contains(logs, pw) {
					t.Fatalf("the %s store's password is in the log: %s", name, loc)
				}
			}
		}
	}
	for _, w := range []struct {
		msg  string
		want map[string]string
	}{
		{"joined", map[string]string{"node": "web1"}},
		{"joined", map[string]string{"node": "db1"}},
		{"applied declaration", map[string]string{"node": "web1"}},
		{"applied declaration", map[string]string{"node": "db1", "serial": "1"}},
		{"alert raised", map[string]string{"condition": "node.silent/db1", "severity": "urgent", "level": "WARN"}},
	} {
		if record(rs, w.msg, w.want) == nil {
			t.Errorf("no %q line with %v in the log:\n%s", w.msg, w.want, logs)
		}
	}
	if r := record(rs, "applied declaration", map[string]string{"node": "web1"}); r != nil {
		if _, ok := r["serial"].(json.Number); !ok {
			t.Errorf("serial is not a number: %v", r)
		}
	}
	for _, e := range encodings {
		if strings.Contains(logs, e) {
			t.Fatalf("the log holds the secret (as %q)", e)
		}
	}
}
