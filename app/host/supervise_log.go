package host

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"gopkg.in/natefinch/lumberjack.v2"
)

// moduleLog is a module's log: its output and the supervisor's own notes,
// each line beginning with the time the host read it (StampLayout, UTC),
// rotated by lumberjack. A module's own timestamps, if it writes any, are
// kept as they are, after the host's.
type moduleLog struct {
	mu      sync.Mutex
	lj      *lumberjack.Logger
	midLine bool // the last byte written was not a newline
	// now is the clock; nil is time.Now (tests set it).
	now func() time.Time
}

// StampLayout is how the time a line was read begins each line of a
// module's log: RFC 3339 in UTC, to the millisecond, then a space.
const StampLayout = "2006-01-02T15:04:05.000Z07:00"

// stamp is the time a line is read, as it begins the line.
func (l *moduleLog) stamp() []byte {
	now := time.Now
	if l.now != nil {
		now = l.now
	}
	return append(now().UTC().AppendFormat(nil, StampLayout), ' ')
}

// Write appends a module's output, each line begun in it stamped with now:
// a line written in pieces is stamped once, when its first piece is read.
func (l *moduleLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	stamp := l.stamp()
	out := make([]byte, 0, len(p)+len(stamp))
	for rest := p; len(rest) > 0; {
		if !l.midLine {
			out = append(out, stamp...)
		}
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			out = append(out, rest...)
			l.midLine = true
			break
		}
		out = append(out, rest[:i+1]...)
		rest = rest[i+1:]
		l.midLine = false
	}
	if _, err := l.lj.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// note appends one line of the supervisor's own, stamped, on a line of its
// own: a module's line cut short by it goes on, stamped anew, after it.
func (l *moduleLog) note(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	line := string(l.stamp()) + "mesh-host: " + fmt.Sprintf(format, args...) + "\n"
	if l.midLine {
		line = "\n" + line
	}
	l.lj.Write([]byte(line))
	l.midLine = false
}

func (l *moduleLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lj.Close()
}

// logFor returns a module's log, made on first use and kept: each
// lumberjack.Logger keeps a goroutine for the life of the process.
func (s *Supervisor) logFor(module string) *moduleLog {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.logs[module]; l != nil {
		return l
	}
	if s.logs == nil {
		s.logs = map[string]*moduleLog{}
	}
	maxMB, backups := s.LogMaxMB, s.LogBackups
	if maxMB <= 0 {
		maxMB = 10
	}
	if backups <= 0 {
		backups = 3
	}
	os.MkdirAll(s.LogDir, 0o750) // lumberjack would make it 0755
	l := &moduleLog{lj: &lumberjack.Logger{Filename: s.logPath(module), MaxSize: maxMB, MaxBackups: backups}}
	s.logs[module] = l
	return l
}

// hasLog says a module's log can be read: one this host runs, or one it
// ran whose log is still there (a module stopped on unassign, whose last
// lines say why it ended).
func (s *Supervisor) hasLog(module string) bool {
	if checkName(module) != nil {
		return false
	}
	if s.known(module) {
		return true
	}
	_, err := os.Stat(s.logPath(module))
	return err == nil
}

func (s *Supervisor) logPath(module string) string {
	return filepath.Join(s.LogDir, module+".log")
}

// Bounds of what Tail reads.
const (
	maxTailLines = 10000
	maxTailBytes = 1 << 20
	maxLineBytes = 64 << 10 // Follow sends a longer line in pieces
)

// Tail returns the last n lines of a module's log, reading from the end of
// the file (and of its newest backup when the current file holds fewer).
func (s *Supervisor) Tail(module string, n int) ([]string, error) {
	if !s.hasLog(module) {
		return nil, fmt.Errorf("tail %s: %w", module, ErrUnknownModule)
	}
	f, end, err := openAtEnd(s.logPath(module))
	if err != nil {
		return nil, fmt.Errorf("tail %s: %w", module, err)
	}
	if f != nil {
		defer f.Close()
	}
	return s.tail(module, f, end, n)
}

// openAtEnd opens a file to read and says where it ends; a missing file
// is a nil one, not an error.
func openAtEnd(name string) (*os.File, int64, error) {
	f, err := os.Open(name)
	if os.IsNotExist(err) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	end, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, end, nil
}

// tail returns the last n lines of a module's log that end before end in
// f (nil when there is no log file yet), then, when f holds fewer, those
// of its newest backup.
func (s *Supervisor) tail(module string, f *os.File, end int64, n int) ([]string, error) {
	n = min(n, maxTailLines)
	if n <= 0 {
		return nil, nil
	}
	var lines []string
	if f != nil {
		var err error
		if lines, err = tailFile(f, end, n); err != nil {
			return nil, fmt.Errorf("tail %s: %w", module, err)
		}
	}
	if len(lines) < n {
		if bf, bend, err := openAtEnd(newestBackup(s.LogDir, module)); err == nil && bf != nil {
			if older, err := tailFile(bf, bend, n-len(lines)); err == nil {
				lines = append(older, lines...)
			}
			bf.Close()
		}
	}
	return lines, nil
}

// tailFile reads the last n lines of f before end backwards in blocks, at
// most maxTailBytes of them.
func tailFile(f *os.File, end int64, n int) ([]string, error) {
	const block = 16 << 10
	var buf []byte
	pos := end
	for pos > 0 && len(buf) < maxTailBytes {
		// One more newline than lines: the one ending the line before them.
		nl := bytes.Count(buf, []byte{'\n'})
		if len(buf) > 0 && buf[len(buf)-1] == '\n' {
			nl--
		}
		if nl >= n {
			break
		}
		size := min(int64(block), pos)
		pos -= size
		chunk := make([]byte, size, int(size)+len(buf))
		if _, err := f.ReadAt(chunk, pos); err != nil && err != io.EOF {
			return nil, err
		}
		buf = append(chunk, buf...)
	}
	text := strings.TrimSuffix(string(buf), "\n")
	if text == "" {
		return nil, nil
	}
	lines := strings.Split(text, "\n")
	if pos > 0 {
		lines = lines[1:] // begins mid-line
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return lines, nil
}

// lumberjackTime is how lumberjack stamps a backup's name:
// <module>-<time>.log.
const lumberjackTime = "2006-01-02T15-04-05.000"

// newestBackup is the newest rotated log of a module, or "".
func newestBackup(dir, module string) string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return ""
	}
	var best string
	var bestT time.Time
	for _, e := range ents {
		stamp, ok := strings.CutPrefix(e.Name(), module+"-")
		if !ok {
			continue
		}
		stamp, ok = strings.CutSuffix(stamp, ".log")
		if !ok {
			continue
		}
		t, err := time.Parse(lumberjackTime, stamp)
		if err != nil { // another module's log, like <module>-web.log
			continue
		}
		if best == "" || t.After(bestT) {
			best, bestT = filepath.Join(dir, e.Name()), t
		}
	}
	return best
}

// Follow first sends the last n lines of a module's log (none when n is 0,
// and then send(nil), so the caller hears at once), then its new lines as
// they are written, polling about every 250ms and following rotation; when
// idle it calls send(nil) at least every 5s, so the caller notices a
// follower gone. The last lines and the new ones meet at one offset: a line
// written meanwhile is sent once. It returns nil when ctx ends, or the
// error send returned.
func (s *Supervisor) Follow(ctx context.Context, module string, n int, send func(lines []string) error) error {
	if !s.hasLog(module) {
		return fmt.Errorf("follow %s: %w", module, ErrUnknownModule)
	}
	idle := s.followIdle
	if idle <= 0 {
		idle = 5 * time.Second
	}
	fl := &follower{path: s.logPath(module)}
	defer fl.close()
	if f, err := os.Open(fl.path); err == nil {
		fl.f = f
		fl.off, _ = f.Seek(0, io.SeekEnd) // only what is written from now on
	}
	last, err := s.tail(module, fl.f, fl.off, n)
	if err != nil {
		return err
	}
	if err := send(last); err != nil {
		return err
	}
	const every = 250 * time.Millisecond
	tick := time.NewTicker(every)
	defer tick.Stop()
	lastSent := time.Now()
	for {
		lines := fl.poll()
		// A tick early rather than late: never more than idle between sends.
		if len(lines) > 0 || time.Since(lastSent) >= idle-every {
			if err := send(lines); err != nil {
				return err
			}
			lastSent = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// follower reads a log file as it grows and across rotations.
type follower struct {
	path    string
	f       *os.File
	off     int64
	partial []byte // a line not ended yet
}

func (fl *follower) close() {
	if fl.f != nil {
		fl.f.Close()
	}
}

// poll returns the lines written since the last poll.
func (fl *follower) poll() []string {
	if fl.f == nil {
		f, err := os.Open(fl.path)
		if err != nil {
			return nil
		}
		fl.f, fl.off = f, 0 // a file made since we began is all new
	}
	lines := fl.drain()
	cur, err := os.Stat(fl.path)
	if err != nil {
		return lines
	}
	old, err := fl.f.Stat()
	if err != nil || !os.SameFile(old, cur) {
		// Rotated: the old file is written no more once renamed; read
		// what reached it after our last read, then the new one from its
		// start. A line cut by the rotation goes on in the new file.
		lines = append(lines, fl.drain()...)
		fl.f.Close()
		fl.f = nil
		if f, err := os.Open(fl.path); err == nil {
			fl.f, fl.off = f, 0
			lines = append(lines, fl.drain()...)
		}
		return lines
	}
	if cur.Size() < fl.off { // truncated in place
		fl.off, fl.partial = 0, nil
		lines = append(lines, fl.drain()...)
	}
	return lines
}

// drain reads the open file from off to its end.
func (fl *follower) drain() []string {
	var lines []string
	buf := make([]byte, 32<<10)
	for {
		n, err := fl.f.ReadAt(buf, fl.off)
		fl.off += int64(n)
		data := buf[:n]
		for len(data) > 0 {
			i := bytes.IndexByte(data, '\n')
			if i < 0 {
				fl.partial = append(fl.partial, data...)
				if len(fl.partial) >= maxLineBytes {
					lines = append(lines, string(fl.partial))
					fl.partial = nil
				}
				break
			}
			lines = append(lines, string(append(fl.partial, data[:i]...)))
			fl.partial = nil
			data = data[i+1:]
		}
		if err != nil || n == 0 {
			return lines
		}
	}
}
