// Package holdtest starts, for tests, what an adopted machine already runs:
// a real process (sleep) holding a listening TCP socket it inherited, the
// socket's only holder once the test's own copies are closed.
package holdtest

import (
	"net"
	"os"
	"os/exec"
	"time"
)

// Holder is a running sleep holding a listening socket.
type Holder struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

// Listen starts a holder of a listening TCP socket on addr, waiting up to
// within for addr to be free (a holder just stopped may still be closing).
func Listen(addr string, within time.Duration) (*Holder, error) {
	var ln net.Listener
	var err error
	for deadline := time.Now().Add(within); ; time.Sleep(20 * time.Millisecond) {
		if ln, err = net.Listen("tcp", addr); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	return Hold(ln.(*net.TCPListener))
}

// Hold starts a holder of ln's socket and closes the caller's copies.
func Hold(ln *net.TCPListener) (*Holder, error) {
	defer ln.Close()
	f, err := ln.File()
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command("sleep", "600")
	cmd.ExtraFiles = []*os.File{f}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	h := &Holder{cmd: cmd, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(h.exited) }()
	return h, nil
}

// Pid is the holder's pid.
func (h *Holder) Pid() int { return h.cmd.Process.Pid }

// Exited is closed once the holder has ended (and been reaped).
func (h *Holder) Exited() <-chan struct{} { return h.exited }

// Stop kills the holder and waits for it to end.
func (h *Holder) Stop() {
	_ = h.cmd.Process.Kill()
	<-h.exited
}
