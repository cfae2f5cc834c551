// Package clirun runs a kong command line the way both binaries do: exit 0
// when done, 1 when refused or failed, 2 for a usage error, and one line on
// stderr saying what went wrong and what to do.
package clirun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"

	"github.com/alecthomas/kong"
	"github.com/posener/complete"

	"mesh-controller/app/probe"
)

// UsageError is a command line that parsed but does not make sense; it exits 2.
type UsageError struct{ Msg string }

func (e UsageError) Error() string { return e.Msg }

// Program is one binary's command line.
type Program struct {
	// Name is the binary's name, the prefix of every error line.
	Name string
	// Options are kong's, besides the writers and exit handling set here.
	Options []kong.Option
	// Hint is the "what to do" half of an error line, "" when there is none.
	Hint func(error) string
	// Bind makes what Run methods are given, once the command line is parsed;
	// ctx ends on SIGINT or SIGTERM.
	Bind func(ctx context.Context) any
	// Provide, if set, gives providers (kong's, made once each and only
	// when a Run asks for what one returns), after Bind: what only some
	// commands need, such as the stores and the services on them.
	Provide func(ctx context.Context) []any
	// Done, if set, is called once the command has run, to close what Bind
	// opened (the stores a process opens once).
	Done func()
	// Predictors complete, for a shell, the arguments and flags whose kong
	// tag names them (predictor:"node"); the rest complete from the
	// model: commands, flags, enums.
	Predictors map[string]complete.Predictor
	// RunBare runs a program given no arguments (its flags come from its
	// environment, as a module's do) rather than showing its help.
	RunBare bool
}

// exit carries an exit status out of kong through a panic, because kong
// calls its Exit (for --help) in the middle of parsing.
type exit int

// Run parses args into cli, runs the chosen command and returns the exit status.
func (p Program) Run(cli any, args []string, stdout, stderr io.Writer) (status int) {
	// No command at all shows the help, and exits 1: nothing was done, and
	// a script that lost its arguments must not read that as success.
	bare := len(args) == 0 && !p.RunBare
	defer func() {
		if r := recover(); r != nil {
			code, ok := r.(exit)
			if !ok {
				panic(r)
			}
			status = int(code)
			if bare && status == 0 {
				status = 1
			}
		}
	}()
	opts := append([]kong.Option{kong.Name(p.Name), kong.Writers(stdout, stderr),
		kong.Exit(func(code int) { panic(exit(code)) }), kong.ValueFormatter(HelpValue)}, p.Options...)
	parser, err := kong.New(cli, opts...)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", p.Name, err)
		return 1
	}
	if status, done := p.completing(parser, stderr); done {
		return status
	}
	if bare {
		args = []string{"--help"}
	}
	kctx, err := parser.Parse(args)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %s, see '%s --help'\n", p.Name, OneLine(err.Error()), p.commandPath(err))
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if p.Done != nil {
		defer p.Done()
	}
	bound := p.Bind(ctx)
	if p.Provide != nil {
		for _, provider := range p.Provide(ctx) {
			if err := kctx.BindSingletonProvider(provider); err != nil {
				panic("clirun: " + err.Error()) // a provider of the wrong shape is a build defect
			}
		}
	}
	if err := kctx.Run(bound); err != nil {
		var usage UsageError
		if errors.As(err, &usage) {
			fmt.Fprintf(stderr, "%s: %s, see '%s --help'\n", p.Name, OneLine(err.Error()), HelpPath(kctx.Selected()))
			return 2
		}
		msg := OneLine(err.Error())
		var detailed interface {
			Details() []string
			Summary() string
		}
		if errors.As(err, &detailed) {
			// Every problem on its own line, then the one-line refusal.
			for _, d := range detailed.Details() {
				fmt.Fprintf(stderr, "  %s\n", OneLine(d))
			}
			msg = detailed.Summary()
		}
		if p.Hint != nil {
			if h := p.Hint(err); h != "" {
				msg += ", " + h
			}
		}
		fmt.Fprintf(stderr, "%s: %s\n", p.Name, msg)
		return 1
	}
	return 0
}

// HelpValue is a flag's help as --help shows it: its default named
// (unless the help already says what it is), then its variable, so that a
// person reads what a service gets when its unit and config file say
// nothing.
func HelpValue(v *kong.Value) string {
	shown := *v
	if v.HasDefault && v.Default != "" && !strings.Contains(strings.ToLower(v.Help), "default") {
		def := "(default " + v.Default + ")"
		if h, ok := strings.CutSuffix(v.Help, "."); ok {
			shown.Help = h + " " + def + "."
		} else {
			shown.Help = strings.TrimSpace(v.Help + " " + def)
		}
	}
	return kong.DefaultHelpValueFormatter(&shown)
}

// commandPath names the command a parse error happened in, for its --help.
func (p Program) commandPath(err error) string {
	var perr *kong.ParseError
	if errors.As(err, &perr) && perr.Context != nil && perr.Context.Selected() != nil {
		return HelpPath(perr.Context.Selected())
	}
	return p.Name
}

// HelpPath is how a person asks for a command's help: its full path, or,
// for a command run when its group is given alone (default:"withargs"),
// the group's, since that is the form a person types.
func HelpPath(n *kong.Node) string {
	if p := n.Parent; p != nil && p.DefaultCmd == n && n.Tag.Default == "withargs" {
		return p.FullPath()
	}
	return n.FullPath()
}

// OneLine folds a message onto one line.
func OneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}

// CPUProfile writes a CPU profile of this process to file (made anew, 0600)
// until stop is called; an empty file profiles nothing. go tool pprof
// reads it. On each SIGUSR2 the profile so far is closed and the next
// begun in file.1, file.2, …: a load measurement cuts its phases apart
// (steady beats, a fan-out) without profiling the whole run as one.
func CPUProfile(file string) (stop func(), err error) {
	if file == "" {
		return func() {}, nil
	}
	start := func(name string) (*os.File, error) {
		f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return nil, err
		}
		return f, nil
	}
	f, err := start(file)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	usr2 := make(chan os.Signal, 1)
	signal.Notify(usr2, syscall.SIGUSR2)
	done := make(chan struct{})
	go func() {
		for n := 1; ; n++ {
			select {
			case <-done:
				return
			case <-usr2:
			}
			mu.Lock()
			if f != nil {
				pprof.StopCPUProfile()
				f.Close()
				f, _ = start(fmt.Sprintf("%s.%d", file, n)) // a profile that cannot begin ends profiling
			}
			mu.Unlock()
		}
	}()
	return func() {
		signal.Stop(usr2)
		close(done)
		mu.Lock()
		defer mu.Unlock()
		if f != nil {
			pprof.StopCPUProfile()
			f.Close()
			f = nil
		}
	}, nil
}

// VersionLine is what a program's version command and --version flag
// print: its name and the version stamped at link time (-ldflags
// "-X main.version=…", as make build and make release do), or
// "development build", never a made-up number.
func VersionLine(program, stamped string) string {
	if stamped == "" || stamped == "development build" {
		return program + " development build"
	}
	return program + " " + stamped
}

// Versioned is the version flag and command of a program whose kong
// options hold the "version" variable (VersionLine): embedded in its CLI,
// --version and the version command print the same line.
type Versioned struct {
	VersionFlag kong.VersionFlag `name:"version" help:"Print the version stamped at link time, as the version command does."`
	Version     VersionCmd       `cmd:"" help:"Print the version stamped at link time."`
}

// VersionCmd prints the "version" variable, as kong.VersionFlag does.
type VersionCmd struct{}

// Run prints the version line.
func (VersionCmd) Run(k *kong.Kong, vars kong.Vars) error {
	_, err := fmt.Fprintln(k.Stdout, vars["version"])
	return err
}

// ListenMetrics opens a --metrics address, nil without one: a loopback
// host:port unless public (--metrics-public) says other machines may read
// what is there. A port taken fails the command before it starts its
// work, rather than leaving it running unwatched.
func ListenMetrics(addr string, public bool) (net.Listener, error) {
	if addr == "" {
		if public {
			return nil, UsageError{Msg: "--metrics-public goes with --metrics"}
		}
		return nil, nil
	}
	if err := probe.CheckAddress(addr, public); errors.Is(err, probe.ErrNotLoopback) {
		return nil, UsageError{Msg: fmt.Sprintf("--metrics %s is not a loopback address: give 127.0.0.1:PORT, or add --metrics-public to let other machines read the metrics", addr)}
	} else if err != nil {
		return nil, UsageError{Msg: fmt.Sprintf("--metrics %s: %v: give host:port", addr, err)}
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for metrics: %w; choose another --metrics address", err)
	}
	return l, nil
}
