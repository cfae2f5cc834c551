package main

import (
	"fmt"
	"strings"

	"github.com/alecthomas/kong"
)

// A command run when its group is given alone (kong's default:"withargs":
// build REPOSITORY, seat NAME --to, doctor, healers, hand-acts…) is named
// in help by that bare form, never by the name it has in the CLI struct:
// "seat hand" is not something a person can type usefully, "seat" is.

// showBareForms names every command run by default after its group, and
// shows it in listings, while help is printed; restore undoes that. kong
// prints a command's path from its name, so that is what is changed.
func showBareForms(root *kong.Node) (restore func()) {
	type saved struct {
		node   *kong.Node
		name   string
		hidden bool
	}
	var was []saved
	var visit func(n *kong.Node)
	visit = func(n *kong.Node) {
		if d := n.DefaultCmd; d != nil && d.Tag.Default == "withargs" {
			was = append(was, saved{d, d.Name, d.Hidden})
			d.Name, d.Hidden = "", false
		}
		for _, c := range n.Children {
			visit(c)
		}
	}
	visit(root)
	return func() {
		for _, s := range was {
			s.node.Name, s.node.Hidden = s.name, s.hidden
		}
	}
}

// usageLines are the "Usage:" lines of help for the selected command (nil:
// the binary). A group with a command run by default has two: its bare
// form, and the group's other commands.
func usageLines(app string, selected *kong.Node) []string {
	if selected == nil {
		return []string{app + " <command> [flags]"}
	}
	if d := selected.DefaultCmd; d != nil && d.Tag.Default == "withargs" {
		return []string{app + " " + summary(d), app + " " + summary(selected)}
	}
	return []string{app + " " + summary(selected)}
}

// summary is a command's usage in one line, as kong's Node.Summary writes
// it, except that arguments come before the flags they go with, as
// commands.md writes them, and required flags of one xor group are
// alternatives, not each required: "token issue (--node=NAME | --new=NAME)".
func summary(n *kong.Node) string {
	parts := []string{n.Path()}
	open := 0
	for _, arg := range n.Positional {
		s := arg.Summary()
		if arg.Tag.Optional {
			open++
			s = strings.TrimSuffix(s, "]")
		}
		parts = append(parts, s)
	}
	if open > 0 {
		parts[len(parts)-1] += strings.Repeat("]", open)
	}
	if len(n.Positional) == 0 && len(n.Children) > 0 {
		parts = append(parts, "<command>")
	}
	var flags []*kong.Flag
	for _, group := range n.AllFlags(true) {
		flags = append(flags, group...)
	}
	shown := map[*kong.Flag]bool{}
	optional := false
	for _, f := range flags {
		switch {
		case f.Name == "help":
		case !f.Required:
			optional = true
		case shown[f]:
		case len(f.Xor) == 0:
			parts = append(parts, f.Summary())
		default:
			var alternatives []string
			for _, g := range flags {
				if g.Required && sharesXor(f, g) {
					shown[g] = true
					alternatives = append(alternatives, g.Summary())
				}
			}
			parts = append(parts, "("+strings.Join(alternatives, " | ")+")")
		}
	}
	if optional {
		parts = append(parts, "[flags]")
	}
	return strings.Join(parts, " ")
}

func sharesXor(a, b *kong.Flag) bool {
	for _, x := range a.Xor {
		for _, y := range b.Xor {
			if x == y {
				return true
			}
		}
	}
	return false
}

// printUsage writes the usage lines as kong would write its one.
func printUsage(kctx *kong.Context) {
	for i, line := range usageLines(kctx.Model.Name, kctx.Selected()) {
		if i == 0 {
			fmt.Fprintf(kctx.Stdout, "Usage: %s\n", line)
		} else {
			fmt.Fprintf(kctx.Stdout, "   or: %s\n", line)
		}
	}
}
