package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"mesh-controller/app"
)

// apiDoc is the API's OpenAPI document as it is served, its schemas
// compiled as asked for: every answer the API tests get is held to it
// (call), so that the document cannot say other than the code.
var apiDoc struct {
	once     sync.Once
	err      error
	doc      map[string]any
	c        *jsonschema.Compiler
	mu       sync.Mutex
	compiled map[string]*jsonschema.Schema
}

// apiDocURL names the document for the compiler; nothing is fetched.
const apiDocURL = "https://mesh-controller.invalid/v1/openapi.json"

func loadAPIDoc() error {
	apiDoc.once.Do(func() {
		if apiDoc.err = json.Unmarshal(app.APIOpenAPI, &apiDoc.doc); apiDoc.err != nil {
			return
		}
		parsed, err := jsonschema.UnmarshalJSON(bytes.NewReader(app.APIOpenAPI))
		if err != nil {
			apiDoc.err = err
			return
		}
		apiDoc.c = jsonschema.NewCompiler()
		apiDoc.c.DefaultDraft(jsonschema.Draft2020) // OpenAPI 3.1's schemas are JSON Schema 2020-12
		apiDoc.c.AssertFormat()                     // a date-time must be one
		apiDoc.err = apiDoc.c.AddResource(apiDocURL, parsed)
		apiDoc.compiled = map[string]*jsonschema.Schema{}
	})
	return apiDoc.err
}

// pointerTo is the JSON pointer to the element of the document at keys.
func pointerTo(keys ...string) string {
	esc := strings.NewReplacer("~", "~0", "/", "~1")
	var b strings.Builder
	b.WriteString("#")
	for _, k := range keys {
		b.WriteString("/" + esc.Replace(k))
	}
	return b.String()
}

// docAt is the element of the document at keys, or nil.
func docAt(keys ...string) any {
	var v any = apiDoc.doc
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// apiRouteOf is the route of the document that serves method on path,
// and its path as the document names it.
func apiRouteOf(method, path string) (app.APIRoute, string, bool) {
	got := strings.Split(path, "/")
	for _, r := range app.APIRoutes {
		m, p, _ := strings.Cut(r.Pattern, " ")
		want := strings.Split(p, "/")
		if m != method || len(want) != len(got) {
			continue
		}
		same := true
		for i := range want {
			param := strings.HasPrefix(want[i], "{")
			same = same && (want[i] == got[i] || param && got[i] != "")
		}
		if same {
			return r, p, true
		}
	}
	return app.APIRoute{}, "", false
}

// answersAsDocumented says how an answer differs from what the document
// says of it: a status the route does not name, or a body its schema does
// not take. What no route serves is answered 404 or 405, an APIError.
func answersAsDocumented(method, rawURL string, status int, body []byte) error {
	if err := loadAPIDoc(); err != nil {
		return fmt.Errorf("the OpenAPI document: %w", err)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return err
	}
	ptr := pointerTo("components", "schemas", "APIError")
	if _, path, ok := apiRouteOf(method, u.Path); ok {
		at := []string{"paths", path, strings.ToLower(method), "responses", strconv.Itoa(status)}
		if docAt(at...) == nil {
			return fmt.Errorf("%s %s answered %d, which the OpenAPI document does not name for it", method, path, status)
		}
		ptr = pointerTo(append(at, "content", "application/json", "schema")...)
	} else if status != 404 && status != 405 {
		return fmt.Errorf("%s %s is no route of the OpenAPI document, and was answered %d, not 404 or 405", method, u.Path, status)
	}
	apiDoc.mu.Lock()
	sch, ok := apiDoc.compiled[ptr]
	if !ok {
		if sch, err = apiDoc.c.Compile(apiDocURL + ptr); err != nil {
			apiDoc.mu.Unlock()
			return fmt.Errorf("compile the document's schema at %s: %w", ptr, err)
		}
		apiDoc.compiled[ptr] = sch
	}
	apiDoc.mu.Unlock()
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return err
	}
	if err := sch.Validate(v); err != nil {
		return fmt.Errorf("%s %s answered %d with a body its schema (%s) does not take: %v", method, u.Path, status, ptr, err)
	}
	return nil
}

// readmeAPISection is the README's section "The HTTP API", its lines.
func readmeAPISection(t *testing.T) []string {
	t.Helper()
	f, err := os.Open("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = line == "## The HTTP API"
		}
		if in {
			out = append(out, line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatal("the README has no section ## The HTTP API")
	}
	return out
}

// readmeAPIStatuses are the rows of the status table in the README's
// section "The HTTP API": status, and what it means.
func readmeAPIStatuses(t *testing.T) map[int]string {
	t.Helper()
	row := regexp.MustCompile("^\\| `(\\d{3})` \\| (.*) \\|$")
	out := map[int]string{}
	for _, line := range readmeAPISection(t) {
		if m := row.FindStringSubmatch(line); m != nil {
			code, _ := strconv.Atoi(m[1])
			out[code] = m[2]
		}
	}
	if len(out) == 0 {
		t.Fatal("the README's section The HTTP API has no table of statuses (rows | `NNN` | what it means |)")
	}
	return out
}

// The README's table of the API's statuses is the code's (app.APIStatuses,
// which the OpenAPI document's responses say too), and each is answered
// for real: every status the document names for each route is provoked
// on that route, and each answer is held to the document by call. 500
// comes last, from the stores closed under the API.
func TestAPI_READMEStatuses(t *testing.T) {
	t.Parallel()
	readme := readmeAPIStatuses(t)
	for code, what := range app.APIStatuses {
		if readme[code] != what {
			t.Errorf("the README says of %d %q; the code (app.APIStatuses) says %q", code, readme[code], what)
		}
	}
	for code := range readme {
		if _, ok := app.APIStatuses[code]; !ok {
			t.Errorf("the README names %d, which the API never answers (app.APIStatuses)", code)
		}
	}

	// Every route is in the README's section too.
	section := strings.Join(readmeAPISection(t), "\n")
	for _, r := range app.APIRoutes {
		_, path, _ := strings.Cut(r.Pattern, " ")
		if !strings.Contains(section, "`"+r.Pattern+"`") && !strings.Contains(section, "`"+path+"`") {
			t.Errorf("the README's section The HTTP API does not name %s", r.Pattern)
		}
	}

	is := newTestIssuer(t)
	c, _ := migrated(t)
	ctx := t.Context()
	if _, err := c.NodeAdd(ctx, "web1", false); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ModuleAdd(ctx, writeManifest(t, `{"module": "fan", "version": "1.0.0", "ports": [{"name": "p", "port": 7001}]}`), ""); err != nil {
		t.Fatal(err)
	}
	base := apiOn(t, c, is, nil)
	admin, reader := is.token(t, nil, []string{"mesh-admin"}, nil), is.token(t, nil, []string{"mesh-read"}, nil)
	act := func(node string, modules ...string) string {
		b, _ := json.Marshal(app.APIAct{Node: node, Modules: modules})
		return string(b)
	}
	// How each status is asked for, of a route: the name in its path (if
	// it has one), the token, the body (if it reads one).
	type ask struct{ name, token, body string }
	asks := map[int]func(r app.APIRoute) ask{
		// assign web1 fan, then unassign it: APIRoutes' order
		200: func(r app.APIRoute) ask {
			if r.Request != nil {
				return ask{"", admin, act("web1", "fan")}
			}
			return ask{"web1", reader, ""}
		},
		400: func(r app.APIRoute) ask {
			if r.Request != nil {
				return ask{"", admin, `{"node": "web1"}`}
			}
			return ask{"Web_1", reader, ""}
		},
		401: func(app.APIRoute) ask { return ask{"web1", "not-a-token", act("web1", "fan")} },
		403: func(app.APIRoute) ask {
			return ask{"web1", is.token(t, nil, []string{"staff"}, nil), act("web1", "fan")}
		},
		404: func(app.APIRoute) ask { return ask{"web9", admin, act("web1", "nosuch")} },
		409: func(app.APIRoute) ask { return ask{"", admin, act("web1", "fan", "fan")} },
		413: func(app.APIRoute) ask {
			return ask{"", admin, act("web1", "fan") + strings.Repeat(" ", app.APIMaxBody)}
		},
	}
	param := regexp.MustCompile(`\{[a-z]+\}`)
	seen := map[int]bool{}
	for _, r := range app.APIRoutes {
		method, path, _ := strings.Cut(r.Pattern, " ")
		for _, status := range append([]int{200}, r.Errors...) {
			how, ok := asks[status]
			if !ok {
				continue // 500, below
			}
			a := how(r)
			if r.Public() {
				a.token = ""
			}
			if r.Request == nil {
				a.body = ""
			}
			at := param.ReplaceAllString(path, a.name)
			got, b := call(t, method, base+at, a.token, a.body)
			if got != status {
				t.Errorf("%s %s answered %d, not the %d the document names: %s", method, at, got, status, b)
			}
			seen[status] = true
		}
	}
	if got, _ := call(t, "DELETE", base+"/v1/status", reader, ""); got != 405 {
		t.Errorf("DELETE /v1/status: %d, not 405", got)
	}
	seen[405] = true
	// The stores closed under the API: whatever reads them fails, 500.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, r := range app.APIRoutes {
		if !slices.Contains(r.Errors, 500) {
			continue
		}
		method, path, _ := strings.Cut(r.Pattern, " ")
		body := ""
		if r.Request != nil {
			body = act("web1", "fan")
		}
		got, b := call(t, method, base+param.ReplaceAllString(path, "web1"), admin, body)
		if got != 500 {
			t.Errorf("%s with the stores closed: %d, not 500: %s", r.Pattern, got, b)
		}
		seen[500] = true
	}
	for code := range app.APIStatuses {
		if !seen[code] {
			t.Errorf("no route was made to answer %d", code)
		}
	}
}
