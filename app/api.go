package app

// The controller's HTTP API (the api command): the read views and the
// assign and unassign acts of the commands, as JSON, to callers holding a
// bearer token from an OpenID Connect issuer.

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/coreos/go-oidc/v3/oidc"

	"mesh-controller/app/probe"
	"mesh-controller/contexts/inventory"
)

// APIMaxBody bounds a request body: 64 KiB. The API's bodies are
// {node, modules}, names of at most 63 bytes, so an act naming a thousand
// modules fits; no route takes a manifest (module add is the command's).
// A body over it is answered 413 once the bound is read, never read whole.
const APIMaxBody = 64 << 10

//go:embed api/openapi.json
var openapiFS embed.FS

// APIOpenAPI is the API's OpenAPI 3 document, as served at /v1/openapi.json.
var APIOpenAPI = func() []byte {
	b, err := openapiFS.ReadFile("api/openapi.json")
	if err != nil {
		panic(err)
	}
	return b
}()

// APIAccess says which claim of a token names its groups, and which groups may
// read and which may also write.
type APIAccess struct {
	GroupsClaim string
	AdminGroup  string
	ReadGroup   string
}

// TokenVerifier checks a raw token: issuer, audience, expiry and signature.
// *oidc.IDTokenVerifier is one.
type TokenVerifier interface {
	Verify(ctx context.Context, raw string) (*oidc.IDToken, error)
}

// APIRoute is one route of the API: the mux's pattern, who may call it,
// and what the OpenAPI document says of it. The document is built from
// these and from the Go types of what each route reads and answers
// (TestAPI_OpenAPIDocument), so that it cannot say other than the code.
type APIRoute struct {
	// Pattern is the mux's: "GET /v1/nodes/{name}".
	Pattern string
	// OperationID names the operation in the OpenAPI document.
	OperationID string
	Summary     string
	// Access is who may call it: the read group (or admin), the admin
	// group, or anyone (apiPublic).
	Access apiLevel
	// Request is the type of the JSON body it reads, nil for none.
	Request reflect.Type
	// Answer is the type of the JSON it answers 200 with.
	Answer reflect.Type
	// Errors are the statuses it may answer besides 200, each with an
	// APIError body.
	Errors []int
}

// Public says anyone may call it, without a token.
func (r APIRoute) Public() bool { return r.Access == apiPublic }

// APIRoutes are the routes the API serves. The OpenAPI document names
// the same (TestAPI_OpenAPIMatchesMux), with these statuses.
var APIRoutes = []APIRoute{
	{Pattern: "POST /v1/assign", OperationID: "assign", Summary: "Put modules on a node (mesh-controller assign)", Access: apiAdmin,
		Request: reflect.TypeFor[APIAct](), Answer: reflect.TypeFor[AssignedMany](), Errors: []int{400, 401, 403, 404, 409, 413, 500}},
	{Pattern: "POST /v1/unassign", OperationID: "unassign", Summary: "Take modules off a node (mesh-controller unassign)", Access: apiAdmin,
		Request: reflect.TypeFor[APIAct](), Answer: reflect.TypeFor[UnassignedMany](), Errors: []int{400, 401, 403, 404, 409, 413, 500}},
	{Pattern: "GET /v1/status", OperationID: "getStatus", Summary: "What is wrong, quiet, out of date (status --json)", Access: apiReader,
		Answer: reflect.TypeFor[StatusView](), Errors: []int{401, 403, 500}},
	{Pattern: "GET /v1/nodes", OperationID: "listNodes", Summary: "Every node (node list --json)", Access: apiReader,
		Answer: reflect.TypeFor[[]NodeView](), Errors: []int{401, 403, 500}},
	{Pattern: "GET /v1/nodes/{name}", OperationID: "getNode", Summary: "One node (node show --json)", Access: apiReader,
		Answer: reflect.TypeFor[NodeDetail](), Errors: []int{400, 401, 403, 404, 500}},
	{Pattern: "GET /v1/plan/{node}", OperationID: "getPlan", Summary: "What a node is declared, and why (plan --json)", Access: apiReader,
		Answer: reflect.TypeFor[PlanShown](), Errors: []int{400, 401, 403, 404, 500}},
	{Pattern: "GET /v1/data", OperationID: "listData", Summary: "Every data set (data --json)", Access: apiReader,
		Answer: reflect.TypeFor[[]DataView](), Errors: []int{401, 403, 500}},
	{Pattern: "GET /v1/openapi.json", OperationID: "getOpenAPI", Summary: "This document (OpenAPI 3.1)", Access: apiPublic,
		Answer: reflect.TypeFor[map[string]any]()},
}

// APIStatuses says what each status the API answers means; the README's
// table of them and the OpenAPI document's responses say the same
// (TestAPI_READMEStatuses). 405 is answered to a method a path is not
// served for, so no operation of the document names it.
var APIStatuses = map[int]string{
	200: "done, or what was asked for",
	400: "the body is not one JSON object {node, modules} without other fields, or a name is not one (a lowercase letter, then up to 62 lowercase letters, digits or dashes)",
	401: "no bearer token, or one refused (expired, another issuer or audience, a key the issuer does not hold): the error says why",
	403: "the token's groups claim holds neither group the route needs",
	404: "a node or module named is not known, or no such route; a module not registered is listed in problems with whatever else is wrong",
	405: "the path is served for another method, named in Allow",
	409: "refused by the judgement the command makes: every problem listed, nothing recorded",
	413: fmt.Sprintf("the body is over %d bytes (%d KiB)", APIMaxBody, APIMaxBody>>10),
	500: "the controller failed (its stores): the error says what",
}

// APIError is the body of every answer but 200: one line, and the
// problems when a judgement refused the act.
type APIError struct {
	// Error is one line: what went wrong, then what to do.
	Error string `json:"error"`
	// Problems are every problem found, when a judgement refused it.
	Problems []string `json:"problems,omitempty"`
}

type apiLevel int

const (
	apiPublic apiLevel = iota
	apiReader
	apiAdmin
)

// API are the services the HTTP API serves: assign and unassign, and the
// read views.
type API struct {
	Health  *Health
	Nodes   *Nodes
	Modules *Modules
	Seats   *Seats
	// stores are the process's, asked by /readyz.
	stores *Stores
}

// NewAPI is the API's services on the process's stores.
func NewAPI(c *Controller, all *Stores) API {
	return API{Health: NewHealth(c, all), Nodes: NewNodes(c, all), Modules: NewModules(c, all), Seats: NewSeats(c, all), stores: all}
}

// APIHandler serves the API, each token checked by v, and /healthz and
// /readyz (ready while every store answers) to anyone. Every request is
// logged to log (nil: nowhere) once answered: its method, path, status,
// duration and who asked (the caller as hand acts keep it, once its token
// is verified), never a token or a header; the probes at debug only.
func (api API) APIHandler(v TokenVerifier, a APIAccess, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &apiServer{api: api, v: v, a: a}
	mux := http.NewServeMux()
	probe.Handle(mux, func(ctx context.Context) error {
		if api.stores == nil {
			return errors.New("no stores")
		}
		return api.stores.answer(ctx, log)
	})
	handlers := map[string]func(http.ResponseWriter, *http.Request, string){
		"POST /v1/assign":   s.assign,
		"POST /v1/unassign": s.unassign,
		"GET /v1/status": func(w http.ResponseWriter, r *http.Request, _ string) {
			apiReply(w)(api.Health.Status(r.Context()))
		},
		"GET /v1/nodes": func(w http.ResponseWriter, r *http.Request, _ string) {
			nodes, err := api.Nodes.NodeList(r.Context())
			if err != nil {
				apiFail(w, err)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			WriteNodesJSON(w, nodes)
		},
		"GET /v1/nodes/{name}": func(w http.ResponseWriter, r *http.Request, _ string) {
			apiReply(w)(api.Nodes.NodeShow(r.Context(), r.PathValue("name")))
		},
		"GET /v1/plan/{node}": func(w http.ResponseWriter, r *http.Request, _ string) {
			v, err := api.Modules.PlanShow(r.Context(), r.PathValue("node"))
			if err != nil {
				apiFail(w, err)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.Write(append(v.JSON, '\n'))
		},
		"GET /v1/data": func(w http.ResponseWriter, r *http.Request, _ string) {
			apiReply(w)(api.Seats.Data(r.Context()))
		},
		// The document is public: it says what may be asked, not what is.
		"GET /v1/openapi.json": func(w http.ResponseWriter, r *http.Request, _ string) {
			w.Header().Set("Content-Type", "application/json")
			w.Write(APIOpenAPI)
		},
	}
	for _, route := range APIRoutes {
		h := handlers[route.Pattern]
		if route.Access == apiPublic {
			mux.HandleFunc(route.Pattern, func(w http.ResponseWriter, r *http.Request) { h(w, r, "") })
			continue
		}
		mux.HandleFunc(route.Pattern, s.need(route.Access, h))
	}
	// What no route takes is answered in JSON too: 405 with Allow when the
	// path is served for another method, else 404.
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		var allow []string
		for _, m := range []string{http.MethodGet, http.MethodPost} {
			other := r.Clone(r.Context())
			other.Method = m
			if _, p := mux.Handler(other); p != "/" {
				allow = append(allow, m)
			}
		}
		if len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			apiError(w, http.StatusMethodNotAllowed, r.Method+" "+r.URL.Path+" is not served; "+strings.Join(allow, " or ")+" is")
			return
		}
		apiError(w, http.StatusNotFound, "no such route: "+r.Method+" "+r.URL.Path+"; see /v1/openapi.json")
	})
	return logRequests(mux, log)
}

// apiCaller is who made a request, as the request log says it: set once
// the token is verified, empty before.
type apiCaller struct{ who string }

type apiCallerKey struct{}

// logRequests logs each request h answered: what was asked (method and
// path, never the query, a header or the body), the status, how long it
// took, and who asked. Probes, asked every few seconds, are logged at
// debug only.
func logRequests(h http.Handler, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		caller := &apiCaller{}
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), apiCallerKey{}, caller)))
		level := slog.LevelInfo
		if probe.Is(r.URL.Path) {
			level = slog.LevelDebug
		}
		if !log.Enabled(r.Context(), level) {
			return
		}
		status := sw.status
		if status == 0 {
			status = http.StatusOK
		}
		attrs := []slog.Attr{slog.String("method", r.Method), slog.String("path", apiClaim(r.URL.Path)), slog.Int("status", status),
			slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000)}
		if caller.who != "" {
			attrs = append(attrs, slog.String("who", caller.who))
		}
		log.LogAttrs(r.Context(), level, "request", attrs...)
	})
}

// statusWriter keeps the status a handler answered with.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

type apiServer struct {
	api API
	v   TokenVerifier
	a   APIAccess
}

// need verifies the request's bearer token and its groups before h runs;
// h is given who the caller is, as the hand-act log keeps it.
func (s *apiServer) need(l apiLevel, h func(http.ResponseWriter, *http.Request, string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		raw, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || raw == "" {
			w.Header().Set("WWW-Authenticate", `Bearer`)
			apiError(w, http.StatusUnauthorized, "no bearer token; send Authorization: Bearer TOKEN from the issuer")
			return
		}
		tok, err := s.v.Verify(r.Context(), raw)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
			apiError(w, http.StatusUnauthorized, "token refused: "+apiOneLine(err.Error()))
			return
		}
		var claims map[string]any
		if err := tok.Claims(&claims); err != nil {
			apiError(w, http.StatusUnauthorized, "token refused: "+apiOneLine(err.Error()))
			return
		}
		who := apiActor(tok.Subject, claims)
		if c, ok := r.Context().Value(apiCallerKey{}).(*apiCaller); ok {
			c.who = who
		}
		groups := claimStrings(claims[s.a.GroupsClaim])
		have := apiLevel(0)
		for _, g := range groups {
			switch g {
			case s.a.AdminGroup:
				have = apiAdmin
			case s.a.ReadGroup:
				have = max(have, apiReader)
			}
		}
		if have < l {
			want := s.a.AdminGroup
			if l == apiReader {
				want = s.a.ReadGroup + " or " + s.a.AdminGroup
			}
			apiError(w, http.StatusForbidden, fmt.Sprintf("%s may not do this: the token's claim %s holds no %s", tok.Subject, s.a.GroupsClaim, want))
			return
		}
		h(w, r, who)
	}
}

// apiMaxClaim bounds each claim a hand act keeps of its caller, in bytes.
const apiMaxClaim = 256

// apiActor is the caller as a hand act keeps it: the subject, and the email and
// name when the token has them. They are kept as the issuer gave them, each
// bounded: a line break or an escape in one is data, which whatever prints the
// hand act escapes (hand-acts quotes it), never layout.
func apiActor(sub string, claims map[string]any) string {
	who := "api:" + apiClaim(sub)
	var more []string
	for _, k := range []string{"email", "name"} {
		if v, ok := claims[k].(string); ok && v != "" {
			more = append(more, apiClaim(v))
		}
	}
	if len(more) > 0 {
		who += " (" + strings.Join(more, ", ") + ")"
	}
	return who
}

// apiClaim is a claim cut to apiMaxClaim bytes, on a character boundary.
func apiClaim(s string) string {
	if len(s) <= apiMaxClaim {
		return s
	}
	cut := apiMaxClaim
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// claimStrings reads a groups claim: a list of strings, or one string.
func claimStrings(v any) []string {
	switch v := v.(type) {
	case string:
		return []string{v}
	case []any:
		var out []string
		for _, e := range v {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

// APIAct is the body of assign and unassign.
type APIAct struct {
	// Node is the node's name.
	Node string `json:"node"`
	// Modules are the modules' names, at least one.
	Modules []string `json:"modules"`
}

func (s *apiServer) assign(w http.ResponseWriter, r *http.Request, who string) {
	req, ok := readAPIAct(w, r)
	if !ok {
		return
	}
	apiReply(w)(s.api.Modules.AssignMany(r.Context(), ManyRequest{Nodes: []string{req.Node}, Modules: req.Modules, Actor: who}))
}

func (s *apiServer) unassign(w http.ResponseWriter, r *http.Request, who string) {
	req, ok := readAPIAct(w, r)
	if !ok {
		return
	}
	apiReply(w)(s.api.Modules.UnassignMany(r.Context(), ManyRequest{Nodes: []string{req.Node}, Modules: req.Modules, Actor: who}))
}

// readAPIAct decodes a body of at most APIMaxBody bytes holding exactly
// one APIAct and nothing else.
func readAPIAct(w http.ResponseWriter, r *http.Request) (APIAct, bool) {
	var req APIAct
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, APIMaxBody))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		apiError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is over %d bytes (%d KiB), the most the API reads; send one act {node, modules} at a time", APIMaxBody, APIMaxBody>>10))
		return req, false
	case err != nil:
		apiError(w, http.StatusBadRequest, "the body could not be read: "+err.Error())
		return req, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err = dec.Decode(&req)
	if err == nil && dec.Decode(new(json.RawMessage)) != io.EOF {
		err = errors.New("more than one JSON value")
	}
	switch {
	case err != nil:
		apiError(w, http.StatusBadRequest, "body is not one JSON object {node, modules}: "+err.Error())
		return req, false
	case req.Node == "" || len(req.Modules) == 0:
		apiError(w, http.StatusBadRequest, "give node and modules")
		return req, false
	}
	return req, true
}

// apiReply writes v as the commands' --json print it, or the error.
func apiReply(w http.ResponseWriter) func(any, error) {
	return func(v any, err error) {
		if err != nil {
			apiFail(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		WriteJSON(w, v)
	}
}

// WriteJSON writes v as the commands' --json print it: indented by two
// spaces, one document a line.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// apiFail answers an error of the app with the status that says whose it
// is: a name that names nothing is 404, even among other problems (they
// are listed with it); a refusal of the judgement is 409.
func apiFail(w http.ResponseWriter, err error) {
	var problems *ProblemsError
	switch {
	case errors.Is(err, inventory.ErrNodeNotFound), errors.Is(err, inventory.ErrModuleNotFound):
		apiError(w, http.StatusNotFound, err.Error())
	case errors.As(err, &problems):
		status := http.StatusConflict
		if len(problems.Unknown) > 0 {
			status = http.StatusNotFound
		}
		apiWriteError(w, status, APIError{Error: problems.Summary(), Problems: problems.Problems})
	case errors.Is(err, ErrInvalidName):
		apiError(w, http.StatusBadRequest, err.Error())
	default:
		apiError(w, http.StatusInternalServerError, err.Error())
	}
}

func apiError(w http.ResponseWriter, status int, msg string) {
	apiWriteError(w, status, APIError{Error: msg})
}

// apiWriteError writes e with its status, its error on one line.
func apiWriteError(w http.ResponseWriter, status int, e APIError) {
	e.Error = apiOneLine(e.Error)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(e)
}

func apiOneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// APIServer is the API's server around h: a client that sends half a
// header, or a body slowly, is cut off rather than holding a connection.
func APIServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 15 * time.Second, WriteTimeout: 60 * time.Second, IdleTimeout: 120 * time.Second}
}
