package scriptcmds

import (
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/rogpeppe/go-internal/testscript"
)

// notifySockets are the scenarios' systemd notification sockets, by the
// socket's path: what a service sent so far, kept for sdnotify wait.
var notifySockets sync.Map

// notifySocket is one scenario's stand-in for systemd's end of sd_notify:
// a real unixgram socket the binary writes its datagrams to.
type notifySocket struct {
	mu       sync.Mutex
	messages []string
	changed  chan struct{}
}

// SDNotify plays systemd's side of sd_notify(3) for a service the
// scenario starts (a real socket, the real datagrams):
//
//	sdnotify listen        a socket at $WORK/notify.sock; NOTIFY_SOCKET names it
//	sdnotify wait REGEXP   until a message (its lines joined by spaces) matches, 20 s at most
func SDNotify(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) == 0 {
		ts.Fatalf("usage: sdnotify listen | sdnotify wait REGEXP")
	}
	path := filepath.Join(ts.Getenv("WORK"), "notify.sock")
	switch {
	case args[0] == "listen" && len(args) == 1:
		conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
		ts.Check(err)
		s := &notifySocket{changed: make(chan struct{})}
		notifySockets.Store(path, s)
		ts.Defer(func() { conn.Close(); notifySockets.Delete(path) })
		go func() {
			buf := make([]byte, 4096)
			for {
				n, err := conn.Read(buf)
				if err != nil {
					return
				}
				s.mu.Lock()
				s.messages = append(s.messages, strings.ReplaceAll(string(buf[:n]), "\n", " "))
				close(s.changed)
				s.changed = make(chan struct{})
				s.mu.Unlock()
			}
		}()
		ts.Setenv("NOTIFY_SOCKET", path)
	case args[0] == "wait" && len(args) == 2:
		re, err := regexp.Compile(args[1])
		ts.Check(err)
		v, ok := notifySockets.Load(path)
		if !ok {
			ts.Fatalf("sdnotify wait: no socket: sdnotify listen first")
		}
		s := v.(*notifySocket)
		deadline := time.After(20 * time.Second)
		for seen := 0; ; {
			s.mu.Lock()
			msgs, changed := s.messages, s.changed
			s.mu.Unlock()
			for _, m := range msgs[seen:] {
				if re.MatchString(m) {
					ts.Logf("sdnotify: %s", m)
					return
				}
			}
			seen = len(msgs)
			select {
			case <-changed:
			case <-deadline:
				ts.Fatalf("sdnotify wait: no message matched %q within 20s; received %q", args[1], msgs)
			}
		}
	default:
		ts.Fatalf("usage: sdnotify listen | sdnotify wait REGEXP")
	}
}
