package main

import (
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
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
	f, ok := env.Stderr.(*os.File)
	return &progress{w: env.Stderr, what: what, start: time.Now(), on: ok && term.IsTerminal(int(f.Fd()))}
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
