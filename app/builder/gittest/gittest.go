// Package gittest serves git repositories over HTTP for tests, with the
// real git http-backend: a private repository that answers only a client
// giving its user and password, as a hosted one does over HTTPS.
package gittest

import (
	"net"
	"net/http"
	"net/http/cgi"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// PrivateRepo serves the bare repository bare over HTTP on loopback to a
// client that gives user and password (basic authentication) and to no
// other, until the test ends; it returns the repository's URL, which holds
// neither.
func PrivateRepo(t testing.TB, bare, user, password string) string {
	t.Helper()
	execPath, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		t.Fatal(err)
	}
	backend := &cgi.Handler{Path: filepath.Join(strings.TrimSpace(string(execPath)), "git-http-backend"),
		Env: []string{"GIT_PROJECT_ROOT=" + filepath.Dir(bare), "GIT_HTTP_EXPORT_ALL=1"}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != user || p != password {
			w.Header().Set("WWW-Authenticate", `Basic realm="private"`)
			http.Error(w, "give a user and password", http.StatusUnauthorized)
			return
		}
		backend.ServeHTTP(w, r)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String() + "/" + filepath.Base(bare)
}
