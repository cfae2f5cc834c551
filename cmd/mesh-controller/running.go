package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"mesh-controller/app"
	"mesh-controller/cmd/clirun"
)

// LogsCmd is logs.
type LogsCmd struct {
	Node   Name `arg:"" predictor:"node" help:"The node."`
	Module Name `arg:"" predictor:"module" help:"The module."`
	Lines  int  `default:"100" help:"How many of the last lines (at most 10000)."`
	Follow bool `short:"f" help:"Then print new lines as they are written, until Ctrl-C."`
}

// Run prints the log.
func (c *LogsCmd) Run(env *Env, md *app.Modules) error {
	if c.Lines < 0 {
		return clirun.UsageError{Msg: "--lines must not be negative"}
	}
	return md.Logs(env.Ctx, string(c.Node), string(c.Module), c.Lines, c.Follow, func(lines []string) error {
		_, err := fmt.Fprintln(env.Stdout, strings.Join(lines, "\n"))
		return err
	})
}

// AskCmd is ask.
type AskCmd struct {
	Module  Name          `arg:"" predictor:"module" help:"The module."`
	Tool    Name          `arg:"" help:"The tool, as its manifest names it."`
	Input   string        `arg:"" optional:"" help:"The tool's input: one JSON value ({} if none; - reads it from standard input)."`
	Node    Name          `predictor:"node" help:"Ask the instance on this node, not any running one."`
	Timeout time.Duration `default:"10s" help:"How long to wait for the answer."`
}

// Run asks and prints the answer.
func (c *AskCmd) Run(env *Env, md *app.Modules) error {
	input := []byte(c.Input)
	if c.Input == "-" {
		b, err := io.ReadAll(io.LimitReader(os.Stdin, app.MaxToolInput+1))
		if err != nil {
			return err
		}
		input = b
	}
	if len(input) > app.MaxToolInput {
		return clirun.UsageError{Msg: fmt.Sprintf("the input is %d bytes, at most %d", len(input), app.MaxToolInput)}
	}
	if len(input) > 0 && !json.Valid(input) {
		return clirun.UsageError{Msg: "the input is not JSON: give one JSON value, such as '{}'"}
	}
	answer, err := md.Ask(env.Ctx, app.AskRequest{Module: string(c.Module), Tool: string(c.Tool), Input: input, Node: string(c.Node), Timeout: c.Timeout})
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "%s\n", strings.TrimRight(string(answer), "\n"))
	return nil
}
