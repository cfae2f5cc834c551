package builder

import (
	"bytes"
	"fmt"
	"strings"
	"sync"

	"mesh-controller/contexts/inventory/manifest"
)

// LogTailLines is how many of a build log's last lines an Outcome carries.
const LogTailLines = 50

// MaxLineBytes bounds one line of a build log: a longer run of output
// without a newline is cut into lines of this size, so a build that
// prints megabytes without one cannot grow the builder's memory.
const MaxLineBytes = 4096

// buildLog is one build's log: each line goes to progress as it is
// complete, and the last LogTailLines are kept. It is an io.Writer for
// the output of git and the build command.
type buildLog struct {
	mu       sync.Mutex
	progress func(line string)
	tail     [LogTailLines]string
	n        int    // lines so far
	partial  []byte // the line being written
}

func newLog(progress func(string)) *buildLog {
	return &buildLog{progress: progress}
}

// Write splits p into lines.
func (l *buildLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			room := MaxLineBytes - len(l.partial)
			if len(p) < room {
				l.partial = append(l.partial, p...)
				return n, nil
			}
			l.partial = append(l.partial, p[:room]...)
			p = p[room:]
			l.emit()
			continue
		}
		room := MaxLineBytes - len(l.partial)
		if i > room {
			l.partial = append(l.partial, p[:room]...)
			p = p[room:]
			l.emit()
			continue
		}
		l.partial = append(l.partial, p[:i]...)
		p = p[i+1:]
		l.emit()
	}
	return n, nil
}

// flush ends a last line that had no newline.
func (l *buildLog) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.partial) > 0 {
		l.emit()
	}
}

// step logs a line of the builder's own, marked as such.
func (l *buildLog) step(format string, a ...any) {
	l.flush()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial[:0], "builder: "+fmt.Sprintf(format, a...)...)
	l.emit()
}

// emit ends the partial line; l.mu is held.
func (l *buildLog) emit() {
	// A URL's credentials (git names the remote in its messages) never
	// leave the builder.
	line := manifest.RedactText(strings.ToValidUTF8(strings.TrimSuffix(string(l.partial), "\r"), "\uFFFD"))
	l.partial = l.partial[:0]
	l.tail[l.n%LogTailLines] = line
	l.n++
	if l.progress != nil {
		l.progress(line)
	}
}

// last is the log's last LogTailLines lines, oldest first.
func (l *buildLog) last() []string {
	l.flush()
	l.mu.Lock()
	defer l.mu.Unlock()
	k := min(l.n, LogTailLines)
	out := make([]string, 0, k)
	for i := l.n - k; i < l.n; i++ {
		out = append(out, l.tail[i%LogTailLines])
	}
	return out
}

// lastLine is the log's last line, or "".
func (l *buildLog) lastLine() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n == 0 {
		return ""
	}
	return l.tail[(l.n-1)%LogTailLines]
}
