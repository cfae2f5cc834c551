package e2e

import (
	"context"
	"fmt"
	"mesh-controller/app"
	"mesh-controller/contexts/health"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// browser finds Debian's Chromium ('make test' installs it). Under make test
// or CI a missing browser fails the test: the board is tested in a real browser, never skipped there.
func browser(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" || os.Getenv("MESH_TEST_TOOLS") != "" {
		t.Fatal("no chromium: 'make test' installs Debian's package (apt-get install chromium)")
	}
	t.Skip("no chromium here; 'make test' installs it")
	return ""
}

// The board, in a real browser: the three sections, the pictures (the
// module grid, a heartbeat chart, the overlay graph) drawn and styled, a
// condition's link to its evidence and history, and a screenshot kept as
// an artifact.
func TestBoard_InABrowser(t *testing.T) {
	t.Parallel()
	exe := browser(t)
	m := newTestMesh(t)
	h := m.join("web1")
	ctx := context.Background()
	m.addModule(example("paperless"))
	m.addModule(example("postgres"))
	if _, err := m.c.Assign(ctx, "web1", []string{"paperless", "postgres"}); err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, func() error {
		if n := m.node("web1"); n.Behind || n.HeartbeatS == 0 {
			return fmt.Errorf("web1 behind %v (applied %d of %d), beating every %vs%s", n.Behind, n.SerialApplied, n.SerialDeclared, n.HeartbeatS, applyFailure(n))
		}
		return nil
	})
	// web1's chart needs an interval between two beats, added to the
	// store's hourly aggregates when the daemon stops: a beat heard after
	// the one above (seen empty when the host stopped after its first beat
	// on a loaded machine).
	first := m.node("web1").LastHeard
	checkFor(t, settle, func() error {
		if n := m.node("web1"); n.LastHeard == nil || first == nil || !n.LastHeard.After(*first) {
			return fmt.Errorf("web1 last heard at %v, as before", n.LastHeard)
		}
		return nil
	})
	// web2 is a record not joined: its row of the grid is postgres
	// assigned and what its "host" said, with a version made to break out
	// of the markup.
	if _, err := m.c.NodeAdd(ctx, "web2", false); err != nil {
		t.Fatal(err)
	}
	if _, err := m.c.Assign(ctx, "web2", []string{"postgres"}); err != nil {
		t.Fatal(err)
	}
	h.stop()
	// The daemon stops too (it flushes what it heard), so its own checks do
	// not change what the page shows while the browser reads it.
	m.stop()
	checkFor(t, settle, func() error {
		if _, err := m.c.SelfCheck(ctx, app.CheckOptions{Bounds: &app.Bounds{HeartbeatFactor: 2, Apply: time.Hour, DataReport: time.Hour, RetiredWaiting: time.Hour, Memory: time.Hour}}); err != nil {
			t.Fatal(err)
		}
		return m.opened(t, "node.silent/web1")()
	})
	st, err := m.c.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const hostile = `16.4.0"><script>document.title='pwned'</script>`
	if err := st.Health.RecordModuleStates(ctx, map[string][]health.ModuleState{"web2": {{Node: "web2", Module: "postgres", Version: hostile,
		State: "starting", Since: time.Now(), HeardAt: time.Now(), ChangedAt: time.Now()}}}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(nil)
	srv.Config.Handler = m.c.BoardHandler(app.BoardHosts(srv.Listener.Addr().String())...)
	srv.Start()
	defer srv.Close()

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-quic", true), chromedp.WindowSize(420, 900))
	actx, cancel := chromedp.NewExecAllocator(ctx, opts...)
	defer cancel()
	bctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	bctx, cancel = context.WithTimeout(bctx, 20*time.Second)
	defer cancel()

	text := func(sel string) string {
		v, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return v
	}
	if err := chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatalf("browser: %v", err)
	}
	wrong, quiet, outOfDate := text("#wrong"), text("#quiet"), text("#out-of-date")
	// The page's own style applies under its Content-Security-Policy.
	width, err := chromedp.Run(bctx, chromedp.Evaluate[string](`getComputedStyle(document.body).maxWidth`))
	if err != nil || width != "960px" {
		t.Fatalf("the page's style did not apply under its CSP: max-width %q %v", width, err)
	}
	// The pictures, as the browser drew them: a cell per node and module,
	// each coloured by the style sheet (SVG's default is black); web1's
	// heartbeat chart with its p50 and p99 lines; a circle per node of the
	// overlay; the hostile version a title's text, not markup.
	type drawn struct {
		Cells, Black, Circles, Charts, P50, P99, Scripts int
		Hostile, Title                                   string
		Width                                            float64
	}
	pics, err := chromedp.Run(bctx, chromedp.Evaluate[drawn](`(() => {
		const all = s => [...document.querySelectorAll(s)];
		const points = s => all(s).reduce((n, p) => n + p.points.numberOfItems, 0);
		return {
			Cells: all('svg rect.cell').length,
			Black: all('svg rect.cell').filter(r => getComputedStyle(r).fill === 'rgb(0, 0, 0)').length,
			Circles: all('svg.graph circle.node').length,
			Charts: all('#heartbeats svg.chart').length,
			P50: points('svg.chart polyline.p50'), P99: points('svg.chart polyline.p99'),
			Scripts: all('script').length,
			Hostile: (document.querySelector('rect.cell.st-starting title') || {}).textContent || '',
			Title: document.title,
			Width: document.querySelector('svg.grid').getBoundingClientRect().width,
		};
	})()`))
	if err != nil {
		t.Fatalf("read the pictures: %v", err)
	}
	if pics.Cells != 2*2 || pics.Black != 0 || pics.Circles != 2 || pics.Charts != 1 || pics.P50 < 2 || pics.P99 < 2 || pics.Scripts != 0 ||
		pics.Hostile != "web2 / postgres: starting, "+hostile || pics.Title != "status — mesh" || pics.Width <= 0 || pics.Width > 420 {
		t.Fatalf("the pictures as drawn: %+v", pics)
	}
	shot, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`a[href="/condition/node.silent%2Fweb1"]`)), chromedp.WaitVisible(chromedp.CSS("#evidence"))); err != nil {
		t.Fatalf("follow the condition's link: %v", err)
	}
	title, evidence, history := text("h1"), text("#evidence"), text("#history")
	for name, c := range map[string][2]string{
		"wrong":       {wrong, "node.silent/web1"},
		"wrong (2)":   {wrong, "data.no-backup/web1/paperless/media"},
		"quiet":       {quiet, "heartbeat/web1"},
		"out of date": {outOfDate, "What is out of date"},
		"title":       {title, "node.silent/web1"},
		"evidence":    {evidence, "last_heard"},
		"history":     {history, "raised"},
	} {
		if !strings.Contains(c[0], c[1]) {
			t.Errorf("%s: %q does not hold %q", name, c[0], c[1])
		}
	}
	out := filepath.Join(os.TempDir(), "mesh-controller-board.png")
	if err := os.WriteFile(out, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot of the board: %s", out)

	// A condition that is not open is a page that says so, not an error.
	resp, err := http.Get(srv.URL + "/condition/node.silent%2Fweb9")
	if err != nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown condition: %v %v", resp, err)
	}
}

// The board answers only to the address it listens on (issue 11, item 13):
// a page that a DNS rebinding points at it gets nothing, and every answer
// carries a strict Content-Security-Policy.
func TestBoard_HostAndCSP(t *testing.T) {
	t.Parallel()
	m := newTestMesh(t)
	srv := httptest.NewUnstartedServer(nil)
	srv.Config.Handler = m.c.BoardHandler(app.BoardHosts(srv.Listener.Addr().String(), "mesh.example")...)
	srv.Start()
	defer srv.Close()
	get := func(host string) *http.Response {
		req, _ := http.NewRequest("GET", srv.URL+"/", nil)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	if r := get("evil.example"); r.StatusCode != http.StatusMisdirectedRequest {
		t.Fatalf("Host evil.example: %s", r.Status)
	}
	if r := get("evil.example:" + port); r.StatusCode != http.StatusMisdirectedRequest {
		t.Fatalf("Host evil.example:%s: %s", port, r.Status)
	}
	for _, h := range []string{srv.Listener.Addr().String(), "localhost:" + port, "mesh.example:" + port} {
		r := get(h)
		if r.StatusCode != http.StatusOK {
			t.Fatalf("Host %s: %s", h, r.Status)
		}
		if csp := r.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "style-src 'sha256-") {
			t.Fatalf("Content-Security-Policy: %q", csp)
		}
	}
}
