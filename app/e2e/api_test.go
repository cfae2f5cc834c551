package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"mesh-controller/app"
	"mesh-controller/app/apptest"
	"mesh-controller/contexts/health"

	"github.com/golang-jwt/jwt/v5"
	"github.com/oauth2-proxy/mockoidc"
)

// testIssuer is a real OpenID Connect issuer on loopback (mockoidc: its
// discovery document), whose key set (served here, so that a test can
// rotate it, and counted) is its current key only.
type testIssuer struct {
	m   *mockoidc.MockOIDC
	mu  sync.Mutex
	key *mockoidc.Keypair
	// fetches counts the key set's fetches.
	fetches atomic.Int64
	// refetch is how often the API that apiOn serves may fetch the keys
	// again: short, so that a test's rotation is picked up at once.
	refetch time.Duration
}

func newTestIssuer(t testing.TB) *testIssuer {
	t.Helper()
	key, err := mockoidc.RandomKeypair(2048)
	if err != nil {
		t.Fatal(err)
	}
	m, err := mockoidc.NewServer(key.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	is := &testIssuer{m: m, key: key, refetch: 50 * time.Millisecond}
	m.AddMiddleware(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != mockoidc.JWKSEndpoint {
				next.ServeHTTP(w, r)
				return
			}
			is.fetches.Add(1)
			is.mu.Lock()
			b, err := is.key.JWKS()
			is.mu.Unlock()
			if err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.Write(b)
		})
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ln, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Shutdown() })
	return is
}

// rotate makes a new key the issuer's only one, and returns it.
func (is *testIssuer) rotate(t testing.TB) *mockoidc.Keypair {
	t.Helper()
	key, err := mockoidc.RandomKeypair(2048)
	if err != nil {
		t.Fatal(err)
	}
	is.mu.Lock()
	defer is.mu.Unlock()
	is.key = key
	return key
}

func (is *testIssuer) current() *mockoidc.Keypair {
	is.mu.Lock()
	defer is.mu.Unlock()
	return is.key
}

// token is a token of this issuer for the API's audience, valid for an
// hour, with the groups given; change alters its claims before signing
// (with key, or the current key when nil).
func (is *testIssuer) token(t testing.TB, key *mockoidc.Keypair, groups []string, change func(jwt.MapClaims)) string {
	t.Helper()
	now := time.Now()
	c := jwt.MapClaims{"iss": is.m.Issuer(), "aud": apiTestAudience, "sub": "u-123", "email": "ada@example.org", "name": "Ada",
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix(), "groups": groups}
	if change != nil {
		change(c)
	}
	if key == nil {
		key = is.current()
	}
	s, err := key.SignJWT(c)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const apiTestAudience = "mesh-controller"

// apiOn serves c's API on loopback through the server the command uses,
// verifying tokens of is; it returns the base URL.
func apiOn(t testing.TB, c *apptest.Mesh, is *testIssuer, tweak func(*http.Server)) string {
	t.Helper()
	return apiLogging(t, c, is, tweak, nil)
}

// apiLogging is apiOn logging each request to log.
func apiLogging(t testing.TB, c *apptest.Mesh, is *testIssuer, tweak func(*http.Server), log *slog.Logger) string {
	t.Helper()
	v, err := app.NewTokenVerifier(context.Background(), is.m.Issuer(), apiTestAudience, app.TokenVerifierOptions{RefetchEvery: is.refetch})
	if err != nil {
		t.Fatal(err)
	}
	srv := app.APIServer(c.API.APIHandler(v, app.APIAccess{GroupsClaim: "groups", AdminGroup: "mesh-admin", ReadGroup: "mesh-read"}, log))
	if tweak != nil {
		tweak(srv)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// call does one request and returns the status and the body; a body that
// is not JSON fails the test (every answer, refusals too, is JSON), and so
// does an answer the OpenAPI document does not say (answersAsDocumented).
func call(t testing.TB, method, url, token, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(b) || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("%s %s: %d, not JSON (%q): %s", method, url, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	if resp.StatusCode >= 400 {
		var e struct{ Error string }
		if json.Unmarshal(b, &e) != nil || e.Error == "" || strings.Contains(e.Error, "\n") {
			t.Fatalf("%s %s: %d without a one-line error: %s", method, url, resp.StatusCode, b)
		}
	}
	if err := answersAsDocumented(method, url, resp.StatusCode, b); err != nil {
		t.Errorf("%v", err)
	}
	return resp.StatusCode, b
}

// Every token the API must refuse, and the ones it must take, from a real
// issuer: expired, another audience, another issuer, a key not in the set,
// none, without the group; and the issuer's key rotated while it serves.
func TestAPI_Tokens(t *testing.T) {
	t.Parallel()
	is := newTestIssuer(t)
	c, _ := migrated(t)
	base := apiOn(t, c, is, nil)
	stranger, err := mockoidc.RandomKeypair(2048)
	if err != nil {
		t.Fatal(err)
	}
	admin, read := []string{"mesh-admin"}, []string{"staff", "mesh-read"}
	cases := []struct {
		name   string
		method string
		token  string
		want   int
	}{
		{"admin reads", "GET", is.token(t, nil, admin, nil), 200},
		{"reader reads", "GET", is.token(t, nil, read, nil), 200},
		{"groups as one string", "GET", is.token(t, nil, nil, func(c jwt.MapClaims) { c["groups"] = "mesh-read" }), 200},
		{"reader may not write", "POST", is.token(t, nil, read, nil), 403},
		{"admin may write (and is told web1 is not known)", "POST", is.token(t, nil, admin, nil), 404},
		{"no group", "GET", is.token(t, nil, []string{"staff"}, nil), 403},
		{"no groups claim", "GET", is.token(t, nil, nil, func(c jwt.MapClaims) { delete(c, "groups") }), 403},
		{"no token", "GET", "", 401},
		{"not a token", "GET", "abc.def.ghi", 401},
		{"expired", "GET", is.token(t, nil, admin, func(c jwt.MapClaims) { c["exp"] = time.Now().Add(-time.Minute).Unix() }), 401},
		{"another audience", "GET", is.token(t, nil, admin, func(c jwt.MapClaims) { c["aud"] = "another-app" }), 401},
		{"another issuer", "GET", is.token(t, nil, admin, func(c jwt.MapClaims) { c["iss"] = "https://issuer.example.org" }), 401},
		{"a key not in the set", "GET", is.token(t, stranger, admin, nil), 401},
	}
	for _, tc := range cases {
		url, body := base+"/v1/nodes", ""
		if tc.method == "POST" {
			url, body = base+"/v1/assign", `{"node": "web1", "modules": ["fan"]}`
		}
		if got, b := call(t, tc.method, url, tc.token, body); got != tc.want {
			t.Errorf("%s: %d, want %d: %s", tc.name, got, tc.want, b)
		}
	}

	// Rotation: the issuer's new key is fetched when a token names it
	// (once the refetch interval is past); a token of the old key is then
	// refused.
	old := is.token(t, nil, admin, nil)
	is.rotate(t)
	rotated := is.token(t, nil, admin, nil)
	checkFor(t, settle, func() error {
		if got, b := call(t, "GET", base+"/v1/nodes", rotated, ""); got != 200 {
			return fmt.Errorf("a token of the rotated key is not taken: %d %s", got, b)
		}
		return nil
	})
	if got, b := call(t, "GET", base+"/v1/nodes", old, ""); got != 401 {
		t.Fatalf("a token of the key rotated out: %d %s", got, b)
	}
}

// Tokens naming key ids the issuer never published, many and at once, cost
// the issuer at most one fetch of its keys per interval, not one each; a
// token of a key held verifies from the cache meanwhile; and a real
// rotation is picked up once the interval is past.
func TestAPI_KeyRefetchBounded(t *testing.T) {
	t.Parallel()
	is := newTestIssuer(t)
	is.refetch = time.Hour
	c, _ := migrated(t)
	base := apiOn(t, c, is, nil)
	read := []string{"mesh-read"}
	good := is.token(t, nil, read, nil)
	if got, b := call(t, "GET", base+"/v1/status", good, ""); got != 200 {
		t.Fatalf("a good token: %d %s", got, b)
	}
	if n := is.fetches.Load(); n != 1 {
		t.Fatalf("%d fetches of the keys for the first token, want 1", n)
	}
	stranger, err := mockoidc.RandomKeypair(2048)
	if err != nil {
		t.Fatal(err)
	}
	unknown := func(i int) string {
		now := time.Now()
		tok := jwt.NewWithClaims(jwt.SigningMethodRS256, jwt.MapClaims{"iss": is.m.Issuer(), "aud": apiTestAudience, "sub": "mallory",
			"iat": now.Unix(), "exp": now.Add(time.Hour).Unix(), "groups": read})
		tok.Header["kid"] = fmt.Sprintf("made-up-%d", i)
		s, err := tok.SignedString(stranger.PrivateKey)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	const asks, at = 400, 8
	var wg sync.WaitGroup
	var refused atomic.Int64
	start := time.Now()
	for w := range at {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < asks; i += at {
				if got, _ := call(t, "GET", base+"/v1/status", unknown(i), ""); got == 401 {
					refused.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d tokens with made-up key ids in %s: %d fetches of the issuer's keys", asks, time.Since(start).Round(time.Millisecond), is.fetches.Load())
	if refused.Load() != asks {
		t.Fatalf("%d of %d tokens of unknown keys refused", refused.Load(), asks)
	}
	if n := is.fetches.Load(); n != 1 {
		t.Fatalf("%d fetches of the keys after %d tokens naming unknown keys, want none past the first", n, asks)
	}
	if got, b := call(t, "GET", base+"/v1/status", good, ""); got != 200 || is.fetches.Load() != 1 {
		t.Fatalf("a token of a key held, after: %d %s (%d fetches)", got, b, is.fetches.Load())
	}

	// A real rotation, on an API whose interval is short: refused, then
	// taken once the interval is past, with a bounded number of fetches
	// while unknown key ids keep coming.
	is.refetch = 300 * time.Millisecond
	base = apiOn(t, c, is, nil)
	if got, _ := call(t, "GET", base+"/v1/status", good, ""); got != 200 {
		t.Fatal("the second API refused a good token")
	}
	before, since := is.fetches.Load(), time.Now()
	is.rotate(t)
	rotated := is.token(t, nil, read, nil)
	i := 0
	checkFor(t, 10*time.Second, func() error {
		i++
		call(t, "GET", base+"/v1/status", unknown(i), "")
		if got, b := call(t, "GET", base+"/v1/status", rotated, ""); got != 200 {
			return fmt.Errorf("a token of the rotated key is not taken (%d fetches): %d %s", is.fetches.Load()-before, got, b)
		}
		return nil
	})
	took, fetched := time.Since(since), is.fetches.Load()-before
	t.Logf("the rotated key taken after %s, %d fetches", took.Round(time.Millisecond), fetched)
	if most := int64(took/is.refetch) + 1; fetched > most {
		t.Fatalf("%d fetches in %s, over one per %s (%d)", fetched, took, is.refetch, most)
	}
	if got, _ := call(t, "GET", base+"/v1/status", good, ""); got != 401 {
		t.Fatalf("a token of the key rotated out: %d", got)
	}
}

// Every endpoint end to end on a real mesh: the read views are the
// commands' --json documents; assign and unassign judge as the commands
// do, all or nothing, and keep the caller as who did it.
func TestAPI_Endpoints(t *testing.T) {
	t.Parallel()
	is := newTestIssuer(t)
	m := newTestMesh(t)
	ctx := context.Background()
	h := m.join("web1")
	m.addModule(writeManifest(t, `{"module": "fan", "version": "1.0.0", "data": [{"name": "d", "path": "/srv/fan", "precious": "rebuildable"}]}`))
	m.addModule(writeManifest(t, `{"module": "other", "version": "1.0.0", "ports": [{"name": "p", "port": 7001}]}`))
	m.addModule(writeManifest(t, `{"module": "clash", "version": "1.0.0", "ports": [{"name": "p", "port": 7001}]}`))
	base := apiOn(t, m.c, is, nil)
	tok := is.token(t, nil, []string{"mesh-admin"}, nil)

	if got, b := call(t, "POST", base+"/v1/assign", tok, `{"node": "web1", "modules": ["fan", "other"]}`); got != 200 {
		t.Fatalf("assign: %d %s", got, b)
	}
	acts, err := m.c.HandActs(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(acts.Acts) != 1 || acts.Acts[0].Who != "api:u-123 (ada@example.org, Ada)" || acts.Acts[0].What != "assign web1 fan other" || acts.Acts[0].Cause != "api" {
		t.Fatalf("the assign's hand act: %+v", acts.Acts)
	}
	// Refused as the command refuses: every problem, nothing recorded.
	before := m.node("web1").SerialDeclared
	got, b := call(t, "POST", base+"/v1/assign", tok, `{"node": "web1", "modules": ["clash", "fan"]}`)
	var refused struct {
		Error    string
		Problems []string
	}
	if json.Unmarshal(b, &refused); got != 409 || len(refused.Problems) != 2 || !strings.Contains(refused.Error, "assign web1 clash fan refused, 2 problems") {
		t.Fatalf("a refused assign: %d %s", got, b)
	}
	if after := m.node("web1").SerialDeclared; after != before {
		t.Fatalf("a refused assign declared: serial %d, then %d", before, after)
	}
	// A module not registered is 404, every problem still listed.
	got, b = call(t, "POST", base+"/v1/assign", tok, `{"node": "web1", "modules": ["nope", "clash"]}`)
	if json.Unmarshal(b, &refused); got != 404 || len(refused.Problems) != 2 || !slices.ContainsFunc(refused.Problems, func(p string) bool {
		return strings.HasPrefix(p, "module nope is not registered")
	}) {
		t.Fatalf("an assign naming a module not registered: %d %s", got, b)
	}
	// The body's bound: at it, read and judged (fan is there already);
	// one byte over, 413 in one line naming the bound.
	atBound := `{"node": "web1", "modules": ["fan"]}`
	atBound += strings.Repeat(" ", app.APIMaxBody-len(atBound))
	if got, b := call(t, "POST", base+"/v1/assign", tok, atBound); got != 409 || !strings.Contains(string(b), "fan is already on web1") {
		t.Fatalf("a body of %d bytes, the bound: %d %s", len(atBound), got, b)
	}
	got, b = call(t, "POST", base+"/v1/assign", tok, atBound+" ")
	var tooBig struct{ Error string }
	if json.Unmarshal(b, &tooBig); got != 413 || !strings.Contains(tooBig.Error, "over 65536 bytes (64 KiB)") {
		t.Fatalf("a body of %d bytes, one over the bound: %d %s", len(atBound)+1, got, b)
	}
	refusals := []struct {
		name, method, path, body string
		want                     int
	}{
		{"not JSON", "POST", "/v1/assign", `node=web1`, 400},
		{"an unknown field", "POST", "/v1/assign", `{"node": "web1", "modules": ["fan"], "force": true}`, 400},
		{"two values", "POST", "/v1/assign", `{"node": "web1", "modules": ["fan"]} {}`, 400},
		{"no modules", "POST", "/v1/assign", `{"node": "web1"}`, 400},
		{"a bad name", "POST", "/v1/assign", `{"node": "Web 1", "modules": ["fan"]}`, 400},
		{"a node not known", "POST", "/v1/assign", `{"node": "web9", "modules": ["fan"]}`, 404},
		{"a module not registered", "POST", "/v1/assign", `{"node": "web1", "modules": ["nope", "clash"]}`, 404},
		{"unassign a node not known", "POST", "/v1/unassign", `{"node": "web9", "modules": ["fan"]}`, 404},
		{"unassign a module not registered", "POST", "/v1/unassign", `{"node": "web1", "modules": ["nope"]}`, 404},
		{"a node not known shown", "GET", "/v1/nodes/web9", "", 404},
		{"a plan of a node not known", "GET", "/v1/plan/web9", "", 404},
		{"no such route", "GET", "/v1/nothing", "", 404},
		{"a method not served", "DELETE", "/v1/nodes", "", 405},
	}
	for _, r := range refusals {
		if got, b := call(t, r.method, base+r.path, tok, r.body); got != r.want {
			t.Errorf("%s: %d, want %d: %s", r.name, got, r.want, b)
		}
	}

	if got, b := call(t, "POST", base+"/v1/unassign", tok, `{"node": "web1", "modules": ["other"]}`); got != 200 {
		t.Fatalf("unassign: %d %s", got, b)
	}
	acts, err = m.c.HandActs(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(acts.Acts) != 2 || !slices.ContainsFunc(acts.Acts, func(a health.HandAct) bool {
		return a.What == "unassign web1 other" && strings.HasPrefix(a.Who, "api:u-123")
	}) {
		t.Fatalf("the unassign's hand act: %+v", acts.Acts)
	}

	// The read views, once the mesh is still (web1 applied, its host and
	// the daemon stopped, so nothing changes between two reads): the same
	// documents as the commands' --json.
	checkFor(t, settle, m.upToDate("web1"))
	h.stop()
	m.stop()
	same := func(path string, v any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		var want bytes.Buffer
		app.WriteJSON(&want, v)
		got, b := call(t, "GET", base+path, tok, "")
		if got != 200 || !bytes.Equal(b, want.Bytes()) {
			t.Fatalf("GET %s: %d\n%s\nwant\n%s", path, got, b, want.Bytes())
		}
	}
	nodes, err := m.c.NodeList(ctx)
	same("/v1/nodes", nodes, err)
	node, err := m.c.NodeShow(ctx, "web1")
	same("/v1/nodes/web1", node, err)
	data, err := m.c.Data(ctx)
	same("/v1/data", data, err)
	plan, err := m.c.PlanShow(ctx, "web1")
	if err != nil {
		t.Fatal(err)
	}
	if got, b := call(t, "GET", base+"/v1/plan/web1", tok, ""); got != 200 || !bytes.Equal(bytes.TrimSpace(b), plan.JSON) {
		t.Fatalf("GET /v1/plan/web1: %d %s", got, b)
	}
	// Status holds ages that move: the same questions.
	status, err := m.c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var gotStatus map[string]json.RawMessage
	if got, b := call(t, "GET", base+"/v1/status", tok, ""); got != 200 || json.Unmarshal(b, &gotStatus) != nil {
		t.Fatalf("GET /v1/status: %d %s", got, b)
	}
	wantStatus, _ := json.Marshal(status)
	var wantKeys map[string]json.RawMessage
	json.Unmarshal(wantStatus, &wantKeys)
	if !slices.Equal(sortedKeys(gotStatus), sortedKeys(wantKeys)) {
		t.Fatalf("status keys %v, want %v", sortedKeys(gotStatus), sortedKeys(wantKeys))
	}

}

func sortedKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// A client that sends half a header is cut off after the header timeout,
// not left holding the connection.
func TestAPI_SlowClient(t *testing.T) {
	t.Parallel()
	is := newTestIssuer(t)
	c, _ := migrated(t)
	d := app.APIServer(nil)
	if d.ReadHeaderTimeout == 0 || d.ReadTimeout == 0 || d.WriteTimeout == 0 || d.IdleTimeout == 0 {
		t.Fatalf("a timeout not set: %+v", d)
	}
	said := fmt.Sprintf("(headers %v s, a whole request %v s, writing an answer %v s)", d.ReadHeaderTimeout.Seconds(), d.ReadTimeout.Seconds(), d.WriteTimeout.Seconds())
	if readme := strings.Join(readmeAPISection(t), " "); !strings.Contains(readme, said) {
		t.Errorf("the README's section The HTTP API does not say the server's timeouts, %s", said)
	}
	const cut = 300 * time.Millisecond
	base := apiOn(t, c, is, func(s *http.Server) { s.ReadHeaderTimeout = cut })
	// The server's clock starts once it has accepted, which may be before
	// Dial returns here: start ours before dialling.
	start := time.Now()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /v1/status HTTP/1.1\r\nHost: x\r\n")
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.Copy(io.Discard, bufio.NewReader(conn))
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the connection still open after 10 s")
	}
	if took := time.Since(start); took < cut {
		t.Fatalf("cut off after %s, before the header timeout %s", took, cut)
	}
}

// The OpenAPI document names every route the mux serves and the mux serves
// every route it names.
func TestAPI_OpenAPIMatchesMux(t *testing.T) {
	t.Parallel()
	is := newTestIssuer(t)
	c, _ := migrated(t)
	base := apiOn(t, c, is, nil)
	got, b := call(t, "GET", base+"/v1/openapi.json", "", "")
	if got != 200 {
		t.Fatalf("openapi.json: %d", got)
	}
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(b, &doc); err != nil || !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("not an OpenAPI 3 document: %v %q", err, doc.OpenAPI)
	}
	var documented []string
	for path, ops := range doc.Paths {
		for method := range ops {
			documented = append(documented, strings.ToUpper(method)+" "+path)
		}
	}
	slices.Sort(documented)
	var served []string
	for _, r := range app.APIRoutes {
		served = append(served, r.Pattern)
	}
	slices.Sort(served)
	if !slices.Equal(documented, served) {
		t.Fatalf("documented %v\nserved %v", documented, served)
	}
	// Each documented route is answered by its own handler, not the
	// catch-all: without a token, 401 (or 200 for the document itself).
	param := regexp.MustCompile(`\{[a-z]+\}`)
	for _, r := range documented {
		method, path, _ := strings.Cut(r, " ")
		got, b := call(t, method, base+param.ReplaceAllString(path, "web1"), "", "{}")
		if got != 401 && !(path == "/v1/openapi.json" && got == 200) {
			t.Errorf("%s: %d %s", r, got, b)
		}
	}
}
