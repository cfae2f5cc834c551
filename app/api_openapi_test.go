package app

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/invopop/jsonschema"

	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory/manifest"
)

var updateOpenAPI = flag.Bool("update", false, "rewrite api/openapi.json from APIRoutes and the Go types they answer")

// The OpenAPI document served at /v1/openapi.json is built from APIRoutes
// and the Go types each route reads and answers (reflected by
// invopop/jsonschema, their doc comments the descriptions): the committed
// api/openapi.json must be what they build now. After changing a route or
// a type it answers: go test ./app -run TestAPI_OpenAPIDocument -update.
// app/e2e validates real answers against it, and redocly lints it.
func TestAPI_OpenAPIDocument(t *testing.T) {
	got := openAPIDocument(t)
	const file = "api/openapi.json"
	if *updateOpenAPI {
		if err := os.WriteFile(file, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is not what APIRoutes and the types they answer build: run go test ./app -run TestAPI_OpenAPIDocument -update, and read the diff", file)
	}
	if !*updateOpenAPI && !bytes.Equal(APIOpenAPI, want) { // embedded when built: the next run checks it
		t.Fatalf("the document served is not %s", file)
	}
}

// redocly is the OpenAPI linter make test installs (its target redocly,
// from the npm registry, into bin/npm).
const redocly = "../bin/npm/node_modules/.bin/redocly"

// The committed document, which is the one served, passes redocly lint
// with its recommended rules and nothing to say: no error and no warning
// (api/redocly.yaml switches one rule off and says why; one location is
// in api/.redocly.lint-ignore.yaml, with why).
func TestAPI_OpenAPILint(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat(redocly); err != nil {
		if os.Getenv("MESH_TEST_TOOLS") != "" || os.Getenv("CI") != "" {
			t.Fatalf("no redocly at %s: make test installs it (make redocly)", redocly)
		}
		t.Skipf("no redocly at %s: make redocly installs it from the npm registry", redocly)
	}
	bin, err := filepath.Abs(redocly)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "lint", "--config", "redocly.yaml", "--format", "json", "openapi.json")
	cmd.Dir = "api"
	// Nothing sent to Redocly, nothing asked of the registry.
	cmd.Env = append(os.Environ(), "REDOCLY_TELEMETRY=off", "REDOCLY_SUPPRESS_UPDATE_NOTICE=true")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var report struct {
		Totals   struct{ Errors, Warnings, Ignored int }
		Problems []struct {
			RuleID, Severity, Message string
			Location                  []struct{ Pointer string }
		}
	}
	if jerr := json.Unmarshal(out, &report); jerr != nil {
		t.Fatalf("redocly lint: %v, %v\n%s\n%s", err, jerr, out, stderr.Bytes())
	}
	for _, p := range report.Problems {
		at := ""
		if len(p.Location) > 0 {
			at = p.Location[0].Pointer
		}
		t.Errorf("redocly lint: %s %s at %s: %s", p.Severity, p.RuleID, at, p.Message)
	}
	if err != nil || report.Totals.Errors+report.Totals.Warnings > 0 {
		t.Fatalf("redocly lint: %v: %d errors, %d warnings", err, report.Totals.Errors, report.Totals.Warnings)
	}
}

// openAPIDocument builds the API's OpenAPI 3.1 document, indented.
func openAPIDocument(t *testing.T) []byte {
	t.Helper()
	schemas := map[string]*jsonschema.Schema{}
	sr := newSchemaReflector(t)
	ref := func(ty reflect.Type) *jsonschema.Schema { return sr.schema(schemas, ty) }
	errorRef := ref(reflect.TypeFor[APIError]())
	nameParam := regexp.MustCompile(`\{([a-z]+)\}`)
	paths := map[string]map[string]any{}
	for _, r := range APIRoutes {
		method, path, _ := strings.Cut(r.Pattern, " ")
		op := map[string]any{"operationId": r.OperationID, "summary": r.Summary}
		switch r.Access {
		case apiPublic:
			op["description"] = "Public: it says what may be asked, not what is."
			op["security"] = []any{}
		case apiReader:
			op["description"] = "Needs a token whose groups claim holds the read group (mesh-read, --read-group) or the admin group (mesh-admin, --admin-group)."
		case apiAdmin:
			op["description"] = "Needs a token whose groups claim holds the admin group (mesh-admin, --admin-group). Judged as the command judges it, all or nothing; kept in the hand-act log as done by api:<sub> (<email>, <name>)."
		}
		var params []any
		for _, m := range nameParam.FindAllStringSubmatch(path, -1) {
			params = append(params, map[string]any{"name": m[1], "in": "path", "required": true,
				"description": "A name: a lowercase letter, then up to 62 lowercase letters, digits or dashes.",
				"schema":      map[string]any{"type": "string", "pattern": protocol.NamePattern}})
		}
		if params != nil {
			op["parameters"] = params
		}
		if r.Request != nil {
			op["requestBody"] = map[string]any{"required": true, "description": fmt.Sprintf("At most %d bytes.", APIMaxBody),
				"content": map[string]any{"application/json": map[string]any{"schema": ref(r.Request)}}}
		}
		responses := map[string]any{"200": map[string]any{"description": "OK: " + APIStatuses[200],
			"content": map[string]any{"application/json": map[string]any{"schema": ref(r.Answer)}}}}
		for _, status := range r.Errors {
			what, ok := APIStatuses[status]
			if !ok {
				t.Fatalf("%s answers %d, which APIStatuses does not say", r.Pattern, status)
			}
			responses[strconv.Itoa(status)] = map[string]any{"description": http.StatusText(status) + ": " + what,
				"content": map[string]any{"application/json": map[string]any{"schema": errorRef}}}
		}
		op["responses"] = responses
		if paths[path] == nil {
			paths[path] = map[string]any{}
		}
		paths[path][strings.ToLower(method)] = op
	}
	doc := map[string]any{
		"openapi": "3.1.0",
		"info": map[string]any{"title": "mesh-controller API", "version": "1",
			"description": "The commands' views, as their --json prints them, and the assign and unassign acts, to holders of a bearer token from the OpenID Connect issuer the API was started with (mesh-controller api --issuer). Every answer but 200 is an APIError: one line, and the problems when a judgement refused the act."},
		"servers":  []any{map[string]any{"url": "/", "description": "Where the API listens (mesh-controller api --listen): the server of this document."}},
		"security": []any{map[string]any{"bearer": []any{}}},
		"paths":    paths,
		"components": map[string]any{
			"securitySchemes": map[string]any{"bearer": map[string]any{"type": "http", "scheme": "bearer", "bearerFormat": "JWT",
				"description": "A token of the issuer for the API's audience (--audience, default mesh-controller): its issuer, audience, expiry and signature are checked."}},
			"schemas": schemas,
		},
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	// invopop refers to its definitions as #/$defs/NAME; they are the
	// document's components.
	b = bytes.ReplaceAll(b, []byte(`"#/$defs/`), []byte(`"#/components/schemas/`))
	return append(b, '\n')
}

// schemaReflector reflects the Go types the API reads and answers.
type schemaReflector struct {
	t     *testing.T
	r     *jsonschema.Reflector
	named map[string]reflect.Type
}

func newSchemaReflector(t *testing.T) *schemaReflector {
	sr := &schemaReflector{t: t, named: map[string]reflect.Type{}}
	sr.r = &jsonschema.Reflector{
		Anonymous: true,
		// A name is a type's name alone: two of one name in two packages
		// would be one component, so the test refuses it.
		Namer: func(ty reflect.Type) string {
			if ty.Name() == "" {
				return ""
			}
			if other, ok := sr.named[ty.Name()]; ok && other != ty {
				t.Fatalf("two types named %s: %s and %s; give one a Namer case", ty.Name(), other, ty)
			}
			sr.named[ty.Name()] = ty
			return ty.Name()
		},
		// Types that write their own JSON.
		Mapper: func(ty reflect.Type) *jsonschema.Schema {
			switch ty {
			case reflect.TypeFor[protocol.Secret]():
				return &jsonschema.Schema{Type: "string", Const: "[REDACTED]"}
			case reflect.TypeFor[manifest.DataBackup]():
				return &jsonschema.Schema{Description: "The backup cadence word alone, or an object saying more.",
					AnyOf: []*jsonschema.Schema{{Type: "string"}, {Type: "object"}}}
			}
			return nil
		},
	}
	for _, dir := range []string{".", "../contexts"} {
		if err := sr.r.AddGoComments("mesh-controller/app", dir); err != nil {
			t.Fatal(err)
		}
	}
	return sr
}

// schema is ty's schema: a reference to a component when ty is a named
// struct, each named type it holds added to schemas.
func (sr *schemaReflector) schema(schemas map[string]*jsonschema.Schema, ty reflect.Type) *jsonschema.Schema {
	s := sr.r.ReflectFromType(ty)
	for name, def := range s.Definitions {
		nullable(def, sr.named[name])
		if old, ok := schemas[name]; ok {
			a, _ := json.Marshal(old)
			b, _ := json.Marshal(def)
			if !bytes.Equal(a, b) {
				sr.t.Fatalf("two schemas named %s", name)
			}
		}
		schemas[name] = def
	}
	s.Definitions, s.Version = nil, ""
	return s
}

// nullable lets each property of def that encoding/json writes as null
// when it is nil (a pointer, a slice, a map not omitted when empty) be
// null, as the JSON may be.
func nullable(def *jsonschema.Schema, ty reflect.Type) {
	if ty == nil || ty.Kind() != reflect.Struct || def.Properties == nil {
		return
	}
	for _, f := range reflect.VisibleFields(ty) {
		tag := f.Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if !f.IsExported() || name == "-" || f.Anonymous && name == "" || slices.Contains(strings.Split(opts, ","), "omitempty") {
			continue
		}
		if name == "" {
			name = f.Name
		}
		switch f.Type.Kind() {
		case reflect.Pointer, reflect.Slice, reflect.Map:
		default:
			continue
		}
		p, ok := def.Properties.Get(name)
		if !ok || p.Type == "" && p.Ref == "" {
			continue // already any value, null too
		}
		def.Properties.Set(name, &jsonschema.Schema{Description: p.Description,
			AnyOf: []*jsonschema.Schema{withoutDescription(p), {Type: "null"}}})
	}
}

func withoutDescription(s *jsonschema.Schema) *jsonschema.Schema {
	c := *s
	c.Description = ""
	return &c
}
