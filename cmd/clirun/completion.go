package clirun

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/alecthomas/kong"
	"github.com/willabides/kongplete"
)

// CompletionCmd prints the script that has a shell complete the binary's
// command line. The script only hands the line to the binary itself
// (COMP_LINE, as posener/complete reads it), which answers from its own
// kong model: the commands, flags and enums it has now, so the script
// never goes stale.
type CompletionCmd struct {
	Shell string `arg:"" enum:"bash,zsh,fish" help:"The shell: bash, zsh or fish."`
}

// scripts are kongplete's, as its install-completions writes them, for
// the shell a person names rather than the one their login runs: each
// calls the binary back with the line to complete.
var scripts = map[string]string{
	"bash": "complete -C ${bin} ${cmd}\n",
	"zsh":  "autoload -U +X bashcompinit && bashcompinit\ncomplete -C ${bin} ${cmd}\n",
	"fish": `function __complete_${cmd}
    set -lx COMP_LINE (commandline -cp)
    test -z (commandline -ct)
    and set COMP_LINE "$COMP_LINE "
    ${bin}
end
complete -f -c ${cmd} -a "(__complete_${cmd})"
`,
}

// Run prints the script for the shell asked, naming this binary by its
// absolute path: the completion then works whatever PATH the shell has.
func (c *CompletionCmd) Run(kctx *kong.Context) error {
	bin, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this binary's path for the script: %w", err)
	}
	if bin, err = filepath.Abs(bin); err != nil {
		return fmt.Errorf("find this binary's path for the script: %w", err)
	}
	vars := map[string]string{"cmd": kctx.Model.Name, "bin": shellQuote(bin)}
	_, err = io.WriteString(kctx.Stdout, os.Expand(scripts[c.Shell], func(s string) string {
		if v, ok := vars[s]; ok {
			return v
		}
		return "$" + s // the fish script's own $COMP_LINE
	}))
	return err
}

// shellQuote is s as one word in bash, zsh and fish: bare when it holds
// nothing a shell reads specially (the usual /usr/local/bin/…), else in
// single quotes.
func shellQuote(s string) string {
	if s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._-+", r))
	}) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// completing answers a shell's completion request, when the binary was run
// for one (COMP_LINE set by the script CompletionCmd prints): it prints the
// words that fit the line and says true, and the binary does nothing else.
func (p Program) completing(parser *kong.Kong, stderr io.Writer) (status int, done bool) {
	if os.Getenv("COMP_LINE") == "" {
		return 0, false
	}
	exited := false
	kongplete.Complete(parser,
		kongplete.WithPredictors(p.Predictors),
		// The first exit counts: after a broken model (a predictor
		// named but not given) kongplete goes on and exits 0.
		kongplete.WithExitFunc(func(code int) {
			if !exited {
				status, exited = code, true
			}
		}),
		kongplete.WithErrorHandler(func(err error) { fmt.Fprintf(stderr, "%s: complete the command line: %v\n", p.Name, err) }))
	return status, exited
}
