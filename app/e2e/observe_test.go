package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"mesh-controller/app/host"
	"mesh-controller/app/protocol"
)

// What a person watching a mesh reads (issue 32): /healthz and /readyz
// beside /metrics and on the HTTP API, the metrics checked by Prometheus's
// own promtool, the logs at debug, and the modules' logs stamped.

// promtool is Prometheus's checker of the text format: MESH_PROMTOOL
// (make test takes it out of Debian's prometheus package into bin/), else
// promtool on PATH. Missing, the test fails under make test and CI, and is
// skipped elsewhere, saying why.
func promtool(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("MESH_PROMTOOL"); p != "" {
		return p
	}
	if p, err := exec.LookPath("promtool"); err == nil {
		return p
	}
	if os.Getenv("MESH_TEST_TOOLS") != "" || os.Getenv("CI") != "" {
		t.Fatal("no promtool: make test brings it into bin/ (make promtool) and names it in MESH_PROMTOOL")
	}
	t.Skip("no promtool: run make promtool and set MESH_PROMTOOL=bin/promtool, or install Debian's prometheus")
	return ""
}

// checkMetrics scrapes url and has promtool check what it says: the text
// format, and Prometheus's naming and help conventions.
func checkMetrics(t *testing.T, promtool, url string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = resp.Body
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool check metrics on %s: %v\n%s", url, err, out)
	}
}

// get is one GET's status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// answers is a check that GET url answers status with a body matching re.
func answers(t *testing.T, url string, status int, re string) func() error {
	return func() error {
		got, body := get(t, url)
		if got != status || !regexp.MustCompile(re).MatchString(body) {
			return fmt.Errorf("GET %s: %d %q, want %d and %s", url, got, body, status, re)
		}
		return nil
	}
}

// metricsAt is where a process said its /metrics is, less the path: the
// base of its /healthz and /readyz.
func metricsAt(t *testing.T, p *serveProc) string {
	t.Helper()
	line, _ := p.wait(t, 20*time.Second, `^metrics: http://\S+/metrics$`, 0)
	return strings.TrimSuffix(strings.TrimPrefix(line.text, "metrics: "), "/metrics")
}

// jsonLine is the first record of p's JSON log with each of want (msg
// too, compared as printed), nil if none.
func (p *serveProc) jsonLine(want map[string]string) map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	var rs []map[string]any
	for _, l := range p.out {
		var r map[string]any
		d := json.NewDecoder(strings.NewReader(l.text))
		d.UseNumber()
		if strings.HasPrefix(l.text, "{") && d.Decode(&r) == nil {
			rs = append(rs, r)
		}
	}
	return record(rs, want["msg"], want)
}

// logsJSON is a check that p logged a JSON line with each of want.
func (p *serveProc) logsJSON(want map[string]string) func() error {
	return func() error {
		if p.jsonLine(want) == nil {
			return fmt.Errorf("%s logged no line with %v:\n%s", p.name, want, p.text())
		}
		return nil
	}
}

// A serving controller and a standby, each with --metrics, and a real
// host with --metrics, as processes: the controllers' /healthz answer, the
// serving one's /readyz is ready and the standby's is 503 saying it stands
// by; the host's /readyz is 503 until its first declaration is applied;
// both /metrics pass promtool and say what the issue asks (build, serving,
// nodes each in one state; the host's modules, applies, restarts); the
// debug logs say the hot paths (a beat sent, a declaration received and
// applied, a heartbeat absorbed); the module's log lines carry the time
// they were read, in the file and through mesh-controller logs.
func TestObserve_ControllersAndHost(t *testing.T) {
	t.Parallel()
	promtool := promtool(t)
	c, st := migrated(t)
	external, _ := externalBroker(t, st, freeAddr(t))
	t.Cleanup(external.Shutdown)
	url := external.ClientURL()
	ctl, mh := buildController(t), buildHost(t)

	// web1 joins while a first controller serves, which then stops: the
	// host starts with no controller to declare anything to it, and runs
	// a real mesh-host with its metrics and its log as JSON at debug; the
	// example module waits in its root.
	first := startServeProc(t, "first", c.DataDir, url)
	first.wait(t, 20*time.Second, readyLine, 0)
	m := &testMesh{t: t, c: c, url: url, logs: &syncBuffer{}}
	dir, hs := m.joinState(t, "web1")
	first.cmd.Process.Signal(syscall.SIGTERM)
	<-first.done
	root := filepath.Join(dir, "root")
	bin := filepath.Join(root, protocol.ModulesDir, "hello", "bin", "hello")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	hello, err := os.ReadFile(buildHello(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, hello, 0o755); err != nil {
		t.Fatal(err)
	}
	m.addModule(helloOnFreePort(t))
	h := startProc(t, "web1", mh, "run", "--state", hs.Dir, "--root", root, "--heartbeat", "200ms", "--no-module-users", "--no-overlay-interface",
		"--metrics", "127.0.0.1:0", "--log-format", "json", "--log-level", "debug")
	hAt := metricsAt(t, h)
	checkFor(t, settle, allOf(
		answers(t, hAt+"/healthz", 200, `^alive\n$`),
		answers(t, hAt+"/readyz", 503, `^not ready: no declaration applied yet\n$`),
		h.logsJSON(map[string]string{"level": "DEBUG", "msg": "beat sent", "node": "web1", "serial_applied": "0"})))

	// Two controllers with their metrics: a serves, b stands by.
	a := startServeProc(t, "a", c.DataDir, url, "--metrics", "127.0.0.1:0", "--log-format", "json", "--log-level", "debug")
	a.wait(t, 20*time.Second, readyLine, 0)
	b := startServeProc(t, "b", c.DataDir, url, "--metrics", "127.0.0.1:0")
	b.wait(t, 20*time.Second, standbyLine, 0)
	aAt, bAt := metricsAt(t, a), metricsAt(t, b)
	checkFor(t, settle, allOf(
		answers(t, aAt+"/healthz", 200, `^alive\n$`),
		answers(t, aAt+"/readyz", 200, `^ready\n$`),
		answers(t, bAt+"/healthz", 200, `^alive\n$`),
		answers(t, bAt+"/readyz", 503, `^not ready: standing by: another controller serves \(lease generation 2\) until \S+Z; this one takes over when that lease lapses\n$`),
		a.logsJSON(map[string]string{"level": "DEBUG", "msg": "heartbeat absorbed", "node": "web1"})))
	if s := scrapeOf(t, bAt+"/metrics"); s.value("mesh_serving") != 0 {
		t.Fatalf("the standby's mesh_serving is %v", s.value("mesh_serving"))
	}
	checkMetrics(t, promtool, bAt+"/metrics")
	// Heard, and still given nothing: not ready.
	checkFor(t, settle, answers(t, hAt+"/readyz", 503, `^not ready: no declaration applied yet\n$`))

	if _, err := c.Assign(context.Background(), "web1", []string{"hello"}); err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, allOf(
		answers(t, hAt+"/readyz", 200, `^ready\n$`),
		m.moduleIn("web1", "hello", protocol.StateReady),
		h.logsJSON(map[string]string{"level": "DEBUG", "msg": "declaration received", "node": "web1", "serial": "1"}),
		h.logsJSON(map[string]string{"level": "INFO", "msg": "applied declaration", "node": "web1", "serial": "1"}),
		func() error {
			if s := scrapeOf(t, hAt+"/metrics"); s.value("mesh_host_modules", "state=ready") != 1 {
				return fmt.Errorf("mesh_host_modules{state=ready} is %v", s.value("mesh_host_modules", "state=ready"))
			}
			return nil
		}))
	if r := h.jsonLine(map[string]string{"msg": "applied declaration", "serial": "1"}); r["duration_ms"] == nil {
		t.Fatalf("the apply's line says no duration: %v", r)
	}
	hm := scrapeOf(t, hAt+"/metrics")
	for _, want := range []struct {
		name   string
		labels []string
		value  float64
	}{
		{"mesh_host_modules", []string{"state=failed"}, 0},
		{"mesh_host_applies_total", []string{"outcome=applied"}, 1},
		{"mesh_host_apply_duration_seconds", nil, 1},
		{"mesh_host_connected", nil, 1},
		{"mesh_host_serial_applied", nil, 1},
		{"mesh_host_build_info", []string{"version=" + host.Version, "protocol=" + protocol.Version}, 1},
	} {
		if got := hm.value(want.name, want.labels...); got != want.value {
			t.Errorf("%s%v is %v, want %v", want.name, want.labels, got, want.value)
		}
	}
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total", "process_resident_memory_bytes"} {
		if hm[name] == nil {
			t.Errorf("the host's metrics have no %s", name)
		}
	}
	checkMetrics(t, promtool, hAt+"/metrics")

	am := scrapeOf(t, aAt+"/metrics")
	if am.value("mesh_serving") != 1 || am.value("mesh_build_info", "version=development build", "protocol="+protocol.Version) != 1 || am["go_goroutines"] == nil || am["process_cpu_seconds_total"] == nil {
		t.Fatalf("serving %v, build_info %v, go_goroutines %v, process_cpu_seconds_total %v", am.value("mesh_serving"),
			am.value("mesh_build_info", "version=development build"), am["go_goroutines"] != nil, am["process_cpu_seconds_total"] != nil)
	}
	// web1 is in one state, whatever the conditions say of it.
	total := 0.0
	for _, state := range []string{"not_joined", "silent", "behind", "current"} {
		total += am.value("mesh_nodes", "state="+state)
	}
	if total != 1 {
		t.Fatalf("mesh_nodes adds up to %v nodes, not web1 alone", total)
	}
	checkMetrics(t, promtool, aAt+"/metrics")

	// hello's lines, in its log file and through the controller, each begin
	// with when its host read it.
	stamped := regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \S`)
	file, err := os.ReadFile(filepath.Join(root, "var", "log", "mesh", "hello.log"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(ctl, "--data", c.DataDir, "--broker", url, "logs", "web1", "hello", "--lines", "5").Output()
	if err != nil {
		t.Fatalf("mesh-controller logs: %v", err)
	}
	for what, text := range map[string]string{"hello.log": string(file), "mesh-controller logs web1 hello": string(out)} {
		lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
		if len(lines) < 2 || !strings.Contains(text, "mesh-host: started pid") {
			t.Fatalf("%s: %q", what, text)
		}
		for _, l := range lines {
			if !stamped.MatchString(l) {
				t.Errorf("%s: a line without the time it was read: %q", what, l)
			}
		}
	}
}

// The API's probes answer anyone, ready while its stores answer and 503
// naming the store once one does not; every request is logged with its
// method, path, status, duration and who asked (once the token is
// verified), never the token; the probes at debug only.
func TestAPI_ProbesAndRequestLog(t *testing.T) {
	t.Parallel()
	is := newTestIssuer(t)
	c, _ := migrated(t)
	logs := &syncBuffer{}
	base := apiLogging(t, c, is, nil, slog.New(slog.NewTextHandler(logs, nil)))
	checkFor(t, settle, allOf(answers(t, base+"/healthz", 200, `^alive\n$`), answers(t, base+"/readyz", 200, `^ready\n$`)))

	read := is.token(t, nil, []string{"mesh-read"}, nil)
	if got, b := call(t, "GET", base+"/v1/nodes", read, ""); got != 200 {
		t.Fatalf("GET /v1/nodes: %d %s", got, b)
	}
	if got, b := call(t, "POST", base+"/v1/assign", read, `{"node": "web1", "modules": ["hello"]}`); got != 403 {
		t.Fatalf("POST /v1/assign with a reader's token: %d %s", got, b)
	}
	forged := read[:len(read)-4] + "AAAA"
	if got, b := call(t, "GET", base+"/v1/status", forged, ""); got != 401 {
		t.Fatalf("a forged token: %d %s", got, b)
	}
	who := "api:u-123 (ada@example.org, Ada)"
	for _, want := range [][]any{
		{"method", "GET", "path", "/v1/nodes", "status", 200, "who", who},
		{"method", "POST", "path", "/v1/assign", "status", 403, "who", who},
		{"method", "GET", "path", "/v1/status", "status", 401},
	} {
		if !logs.logged("request", want...) {
			t.Errorf("no request line with %v:\n%s", want, logs.String())
		}
	}
	text := logs.String()
	for _, secret := range []string{read, forged, strings.Split(read, ".")[2], "Bearer"} {
		if strings.Contains(text, secret) {
			t.Fatalf("the request log holds %q:\n%s", secret, text)
		}
	}
	if strings.Contains(text, "/healthz") || strings.Contains(text, "/readyz") || !strings.Contains(text, "duration_ms=") {
		t.Fatalf("probes logged at info, or no duration:\n%s", text)
	}
	if logs.logged("request", "status", 401, "who", who) {
		t.Fatalf("a refused token's request says who:\n%s", text)
	}

	c.Close()
	checkFor(t, settle, answers(t, base+"/readyz", 503, `^not ready: the inventory store does not answer\n$`))
	if !logs.logged("readiness: a store does not answer", "store", "inventory") {
		t.Fatalf("the store's error is not in the log:\n%s", logs.String())
	}
}
