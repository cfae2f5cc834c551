package manifest

import (
	"errors"
	"strings"
	"testing"
)

// Every way a repository URL carries a credential is refused, its message
// naming it redacted; a name alone over ssh, a path and a plain URL are not.
func TestCheckRepository(t *testing.T) {
	const secret = "s3cr3t-t0ken"
	refused := []string{
		"https://ada:" + secret + "@git.example/mesh/greeter",
		"https://" + secret + "@github.com/mesh/greeter.git",
		"http://" + secret + ":x-oauth-basic@git.example/greeter",
		"ssh://git:" + secret + "@git.example/greeter",
		"https://git.example/greeter.git?private_token=" + secret,
		"https://git.example/greeter.git?ref=main&X-Amz-Signature=" + secret + "#frag",
		"https://git.example/greeter.git?access_token=" + secret,
		"git://" + secret + "@git.example/greeter",
	}
	for _, repo := range refused {
		err := CheckRepository(repo)
		if !errors.Is(err, ErrRepositoryCredential) {
			t.Errorf("%s: %v, want refused", repo, err)
			continue
		}
		if msg := err.Error(); strings.Contains(msg, secret) || strings.Contains(msg, "\n") || !strings.Contains(msg, "repository ") {
			t.Errorf("%s: the refusal %q holds the credential, or names not the repository", repo, msg)
		}
	}
	for _, repo := range []string{
		"/srv/git/greeter.git", "../greeter", "file:///srv/git/greeter.git", "https://git.example/mesh/greeter",
		"ssh://git@git.example/greeter.git", "git@github.com:mesh/greeter.git", "https://git.example/greeter?ref=main",
		"https://git.example/@scope/greeter",
	} {
		if err := CheckRepository(repo); err != nil {
			t.Errorf("%s refused: %v", repo, err)
		}
	}
}

func TestRedactRepository(t *testing.T) {
	for in, want := range map[string]string{
		"https://ada:tok@git.example/greeter":              "https://***@git.example/greeter",
		"https://ghp_abc@github.com/x/y.git":               "https://***@github.com/x/y.git",
		"ssh://git:pw@git.example/y":                       "ssh://git:***@git.example/y",
		"ssh://git@git.example/y":                          "ssh://git@git.example/y",
		"https://git.example/y?private_token=abc&ref=main": "https://git.example/y?private_token=***&ref=main",
		"https://u:p@git.example:8443/y?sig=abc#top":       "https://***@git.example:8443/y?sig=***#top",
		"/srv/git/greeter.git":                             "/srv/git/greeter.git",
		"https://u:%zz@bad":                                "https://***@bad",
		"https://git.example/@scope/x":                     "https://git.example/@scope/x",
	} {
		if got := RedactRepository(in); got != want {
			t.Errorf("RedactRepository(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRedactText(t *testing.T) {
	in := "clone https://ada:tok1@git.example/x: fatal: unable to access 'https://tok2@git.example/x/': 403; see <https://git.example/y?token=tok3>; ssh://git@h/z"
	got := RedactText(in)
	for _, tok := range []string{"tok1", "tok2", "tok3"} {
		if strings.Contains(got, tok) {
			t.Errorf("%q still holds %s", got, tok)
		}
	}
	if want := "clone https://***@git.example/x: fatal: unable to access 'https://***@git.example/x/': 403; see <https://git.example/y?token=***>; ssh://git@h/z"; got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	if s := "no url here"; RedactText(s) != s {
		t.Error("a text without a URL changed")
	}
}

func TestParse_SourceWithCredential(t *testing.T) {
	_, ps := Parse([]byte(`{"module": "greeter", "version": "1.0.0", "source": "https://ada:Xq9zz@git.example/greeter",
		"data": [{"name": "d", "path": "/d", "precious": "rebuildable"}]}`))
	if len(ps) != 1 || ps[0].Field != "source" || strings.Contains(ps[0].What, "Xq9zz") {
		t.Fatalf("problems %v", ps)
	}
}
