package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"mesh-controller/app"
	"mesh-controller/contexts/inventory"
)

// progressAfter is how long an act runs before its progress is shown.
const progressAfter = time.Second

// progress shows on the terminal how far a long act is: a bar for each
// stage ("judged", "planned", "sent"…) once the act has run for a second,
// nothing at all when standard error is not a terminal (a script, a log).
// done ends the bar shown last.
type progress struct {
	w     io.Writer
	what  string
	start time.Time
	on    bool
	stage string
	bar   *progressbar.ProgressBar
}

// newProgress is a progress for what, written to env's standard error.
func newProgress(env *Env, what string) *progress {
	return &progress{w: env.Stderr, what: what, start: time.Now(), on: terminal(env.Stderr)}
}

// tell says that done of total are through stage.
func (p *progress) tell(stage string, done, total int) {
	if !p.on || total < 2 || time.Since(p.start) < progressAfter {
		return
	}
	if p.bar == nil || p.stage != stage {
		p.done()
		p.stage = stage
		p.bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(p.w), progressbar.OptionSetDescription(p.what+": "+stage),
			progressbar.OptionShowCount(), progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionClearOnFinish(),
			progressbar.OptionSetWidth(30))
	}
	_ = p.bar.Set(done)
}

// done ends the bar shown, if any.
func (p *progress) done() {
	if p.bar != nil {
		_ = p.bar.Finish()
		p.bar = nil
	}
}

// rollOutLine follows a roll-out (or its rollback) on a terminal: one
// running line on standard error, the nodes done, failed and waiting of
// all and the time it has taken, in place of a line a node; what is said
// once (recorded, rolling back and why) still prints, above it.
type rollOutLine struct {
	env   *Env
	label string
	bar   *progressbar.ProgressBar
	back  bool
}

// followRollOut is how a roll-out of label (a module, mesh-host) is shown
// as it goes: progress for the lines, and tally unless the lines are
// wanted whole — asked (--verbose), or standard output or error is not a
// terminal (a script, a log and the README read those lines). end, called
// once the roll-out ended, leaves the running line's last state on its
// own line.
func followRollOut(env *Env, label string, verbose bool) (progress func(string), tally func(app.RollOutTally), end func()) {
	progress = func(s string) { fmt.Fprintln(env.Stdout, s) }
	if verbose || !terminal(env.Stdout) || !terminal(env.Stderr) {
		return progress, nil, func() {}
	}
	l := &rollOutLine{env: env, label: label}
	return l.say, l.tally, l.end
}

// terminal says w is a terminal.
func terminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// say prints a line said once above the running line.
func (l *rollOutLine) say(s string) {
	if l.bar != nil && !l.bar.IsFinished() {
		_ = l.bar.Clear()
	}
	fmt.Fprintln(l.env.Stdout, s)
	if l.bar != nil && !l.bar.IsFinished() {
		_ = l.bar.RenderBlank()
	}
}

// tally redraws the running line with the roll-out's counts.
func (l *rollOutLine) tally(t app.RollOutTally) {
	desc := fmt.Sprintf("%s %s: %d done, %d failed, %d waiting of %d", l.label, t.To, t.Done, t.Failed, t.Waiting, t.Total)
	if t.Phase == inventory.RollOutSoaking {
		desc += ", soaking"
	}
	if t.Back {
		desc = fmt.Sprintf("%s back from %s: %d back, %d not back, %d returning of %d", l.label, t.To, t.Done, t.Failed, t.Waiting, t.Total)
	}
	if l.bar == nil || t.Back != l.back {
		l.end()
		l.back = t.Back
		l.bar = progressbar.NewOptions(max(t.Total, 1), progressbar.OptionSetWriter(l.env.Stderr), progressbar.OptionSetDescription(desc),
			progressbar.OptionSetWidth(10), progressbar.OptionSetElapsedTime(true), progressbar.OptionSetPredictTime(false))
	}
	if l.bar.GetMax() != max(t.Total, 1) {
		l.bar.ChangeMax(max(t.Total, 1))
	}
	// Counted, then described: the description redraws the line, so the
	// last drawn (finished or not) says the counts it shows.
	_ = l.bar.Set(t.Done + t.Failed)
	l.bar.Describe(desc)
}

// end leaves the running line as it last was, and goes to the next line.
func (l *rollOutLine) end() {
	if l.bar == nil {
		return
	}
	_ = l.bar.Exit()
	fmt.Fprintln(l.env.Stderr)
	l.bar = nil
}
