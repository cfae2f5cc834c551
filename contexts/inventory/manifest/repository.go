package manifest

import (
	"fmt"
	"strings"
)

// ErrRepositoryCredential means a repository URL carries a credential: a
// user and password (or a token as the user) before its host, or a
// token-like query value. The mesh keeps and prints repositories, so a
// credential belongs to the builder, as its secret, never in the URL.
var ErrRepositoryCredential error = refusal("holds a credential in its URL")

// refusal is an error of the manifest's own rules: a store that meets one
// passes it as it is (it says Refused, as embedded/sqlite's refusals do),
// with no store linked here.
type refusal string

func (r refusal) Error() string { return string(r) }

// Refused marks it a refusal, not a store's failure.
func (refusal) Refused() bool { return true }

// GitCredentialsSecret is the secret of a builder module through which it
// reaches private repositories over HTTPS: git-credential-store lines
// (scheme, user, token and host as one URL each), handed to git by a
// credential helper.
const GitCredentialsSecret = "git-credentials"

// RepositoryCredentialHint says what to do instead of a credential in a
// repository URL.
const RepositoryCredentialHint = "name the repository without it, and give the credential to the builder: declare the secret " +
	GitCredentialsSecret + " (made_by person) in the builder module's manifest, then 'mesh-controller secret accept NODE BUILDER " +
	GitCredentialsSecret + " --from FILE', FILE in git-credential-store format (git help credential-store)"

// CheckRepository refuses a repository URL (or path) that carries a
// credential; the error names it redacted, never the credential
// (RepositoryCredentialHint says what to do). A user alone is allowed over
// ssh (ssh://git@host/…, git@host:…): it is a name, not a secret.
func CheckRepository(repository string) error {
	if what := repositoryCredential(repository); what != "" {
		return fmt.Errorf("repository %s %w (%s)", RedactRepository(repository), ErrRepositoryCredential, what)
	}
	return nil
}

// repositoryCredential says what credential a repository URL carries, ""
// when none.
func repositoryCredential(repository string) string {
	scheme, rest, ok := strings.Cut(repository, "://")
	if !ok {
		return "" // a path, or scp-like user@host:path, which has no password
	}
	authority, tail := splitAuthority(rest)
	if at := strings.LastIndexByte(authority, '@'); at >= 0 {
		if userinfo := authority[:at]; strings.ContainsRune(userinfo, ':') || !sshScheme(scheme) {
			return "a user and password, or a token, before its host"
		}
	}
	if _, query, ok := strings.Cut(tail, "?"); ok {
		query, _, _ = strings.Cut(query, "#")
		for _, pair := range strings.Split(query, "&") {
			if key, value, _ := strings.Cut(pair, "="); value != "" && tokenKey(key) {
				return fmt.Sprintf("a token-like query value %s=", key)
			}
		}
	}
	return ""
}

// RedactRepository is a repository as the mesh prints and logs it: the
// user and password before its host become ***, and so does the value of
// every token-like query key (token, secret, password, key, auth, sig,
// cred, session…). A user alone over ssh is kept. Anything else, a path
// or a malformed URL included, is unchanged.
func RedactRepository(repository string) string {
	scheme, rest, ok := strings.Cut(repository, "://")
	if !ok {
		return repository
	}
	authority, tail := splitAuthority(rest)
	if at := strings.LastIndexByte(authority, '@'); at >= 0 {
		userinfo := authority[:at]
		switch user, _, hasPassword := strings.Cut(userinfo, ":"); {
		case hasPassword && sshScheme(scheme):
			authority = user + ":***" + authority[at:]
		case hasPassword || !sshScheme(scheme):
			authority = "***" + authority[at:]
		}
	}
	path, query, hasQuery := strings.Cut(tail, "?")
	if hasQuery {
		query, fragment, hasFragment := strings.Cut(query, "#")
		pairs := strings.Split(query, "&")
		for i, pair := range pairs {
			if key, _, hasValue := strings.Cut(pair, "="); hasValue && tokenKey(key) {
				pairs[i] = key + "=***"
			}
		}
		path += "?" + strings.Join(pairs, "&")
		if hasFragment {
			path += "#" + fragment
		}
	}
	return scheme + "://" + authority + path
}

// RedactText redacts every URL in a text (a git message, a log line, an
// outcome's why) as RedactRepository does: a URL is taken to run from its
// scheme to the next space, quote or bracket.
func RedactText(s string) string {
	if !strings.Contains(s, "://") {
		return s
	}
	var b strings.Builder
	for {
		i := strings.Index(s, "://")
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		start := i
		for start > 0 && schemeByte(s[start-1]) {
			start--
		}
		end := i + 3
		for end < len(s) && !urlEnds(s[end]) {
			end++
		}
		b.WriteString(s[:start])
		b.WriteString(RedactRepository(s[start:end]))
		s = s[end:]
	}
}

// splitAuthority splits what follows a URL's "://" into its authority
// (userinfo@host:port) and the rest (path, query, fragment).
func splitAuthority(rest string) (string, string) {
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		return rest[:i], rest[i:]
	}
	return rest, ""
}

// sshScheme says a scheme is git's ssh transport, whose user names an
// account, not a secret.
func sshScheme(scheme string) bool {
	switch strings.ToLower(scheme) {
	case "ssh", "git+ssh", "ssh+git":
		return true
	}
	return false
}

// tokenWords are the parts of a query key that mark its value a
// credential (token, access_token, private_token, X-Amz-Signature,
// X-Amz-Credential, password, api_key, auth…).
var tokenWords = []string{"token", "secret", "pass", "pwd", "key", "auth", "sig", "cred", "session", "bearer", "jwt"}

// tokenKey says a query key's value is a credential.
func tokenKey(key string) bool {
	key = strings.ToLower(key)
	for _, w := range tokenWords {
		if strings.Contains(key, w) {
			return true
		}
	}
	return false
}

// schemeByte is a byte a URL scheme may hold.
func schemeByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'
}

// urlEnds is a byte that ends a URL in a text.
func urlEnds(c byte) bool {
	return c <= ' ' || c == 0x7f || strings.IndexByte("\"'`<>()[]{}|\\^", c) >= 0
}
