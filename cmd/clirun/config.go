package clirun

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"reflect"
	"sort"
	"strings"

	"github.com/alecthomas/kong"
	"github.com/pelletier/go-toml/v2"
)

// ConfigFile is the --config-file flag: a TOML file giving flags the values a
// service's unit would otherwise carry. Its default (the program's file
// under /etc) may be missing or unreadable, and is then passed over; a
// file named on the command line or in the flag's variable must be there.
//
// A key names a flag (data = "/srv/mesh", check-every = "1m") and applies
// to every command that has that flag; a table named after a command
// ([serve], [store.backup]) holds keys for that command alone and wins
// over the top level. A flag given on the command line, or through its
// environment variable, wins over the file. A key that is no flag is
// refused, naming the key and the file.
type ConfigFile string

// BeforeResolve loads the file with the loader kong.Configuration(TOML)
// registered, before kong resolves the flags left unset.
func (c ConfigFile) BeforeResolve(k *kong.Kong, ctx *kong.Context, trace *kong.Path) error {
	path, _ := ctx.FlagValue(trace.Flag).(ConfigFile)
	if path == "" {
		return nil
	}
	if _, err := os.Stat(string(path)); err != nil {
		if string(path) == trace.Flag.Default && (errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission)) {
			return nil // the default file is optional
		}
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("--config-file %s does not exist: give a file that is there", path)
		}
		return fmt.Errorf("--config-file %s: %w", path, err)
	}
	r, err := k.LoadConfig(string(path))
	if err != nil {
		return err // TOML names the file
	}
	ctx.AddResolver(r)
	return nil
}

// TOML is a kong.ConfigurationLoader reading a ConfigFile.
func TOML(r io.Reader) (kong.Resolver, error) {
	name := "the configuration file"
	if f, ok := r.(interface{ Name() string }); ok {
		name = f.Name()
	}
	var values map[string]any
	if err := toml.NewDecoder(r).Decode(&values); err != nil {
		return nil, fmt.Errorf("%s is not valid TOML: %s", name, OneLine(err.Error()))
	}
	return &tomlResolver{file: name, values: values}, nil
}

// tomlResolver gives flags their values from one file.
type tomlResolver struct {
	file   string
	values map[string]any
}

// notConfigured are flags a file cannot give: they act before it is read,
// or end the program.
var notConfigured = map[string]bool{"config-file": true, "help": true, "version": true}

// Validate refuses a key that is no flag of the command (or table) it is in.
func (t *tomlResolver) Validate(app *kong.Application) error {
	return t.validate(app.Node, t.values, "")
}

func (t *tomlResolver) validate(node *kong.Node, values map[string]any, prefix string) error {
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		if table, ok := values[key].(map[string]any); ok {
			if child := childCommand(node, key); child != nil {
				if err := t.validate(child, table, prefix+key+"."); err != nil {
					return err
				}
				continue
			}
		}
		if !notConfigured[key] && hasFlag(node, key) {
			continue
		}
		return fmt.Errorf("%s: unknown key %q: no flag of '%s' is named %s; remove it (flags are named as --help shows them, without the dashes)",
			t.file, prefix+key, node.FullPath(), key)
	}
	return nil
}

// childCommand is node's subcommand named name, nil when none is.
func childCommand(node *kong.Node, name string) *kong.Node {
	for _, c := range node.Children {
		if c.Type == kong.CommandNode && c.Name == name {
			return c
		}
	}
	return nil
}

// hasFlag says whether a flag named name applies beneath node: its own,
// an ancestor's (inherited), or a descendant command's.
func hasFlag(node *kong.Node, name string) bool {
	for n := node; n != nil; n = n.Parent {
		for _, f := range n.Flags {
			if f.Name == name {
				return true
			}
		}
	}
	var below func(n *kong.Node) bool
	below = func(n *kong.Node) bool {
		for _, c := range n.Children {
			for _, f := range c.Flags {
				if f.Name == name {
					return true
				}
			}
			if below(c) {
				return true
			}
		}
		return false
	}
	return below(node)
}

// Resolve gives flag the value of the most specific table along the
// selected command's path that names it, unless its environment variable
// is set (the environment wins over the file, as over the defaults).
func (t *tomlResolver) Resolve(ctx *kong.Context, _ *kong.Path, flag *kong.Flag) (any, error) {
	if notConfigured[flag.Name] {
		return nil, nil
	}
	for _, env := range flag.Tag.Envs {
		if _, ok := os.LookupEnv(env); ok {
			return nil, nil
		}
	}
	var path []string
	if sel := ctx.Selected(); sel != nil {
		for n := sel; n != nil && n.Type == kong.CommandNode; n = n.Parent {
			path = append([]string{n.Name}, path...)
		}
	}
	for depth := len(path); depth >= 0; depth-- {
		table := t.values
		for _, name := range path[:depth] {
			table, _ = table[name].(map[string]any)
		}
		if v, ok := table[flag.Name]; ok {
			if _, isTable := v.(map[string]any); isTable {
				continue
			}
			// Tried on a copy first, so that a wrong value names the file.
			trial := reflect.New(flag.Target.Type()).Elem()
			if err := flag.Mapper.Decode(&kong.DecodeContext{Value: flag.Value, Scan: kong.Scan().PushTyped(v, kong.FlagValueToken)}, trial); err != nil {
				return nil, fmt.Errorf("%s, key %s: %w", t.file, strings.Join(append(path[:depth:depth], flag.Name), "."), err)
			}
			return v, nil
		}
	}
	return nil, nil
}
