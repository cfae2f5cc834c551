package service

import (
	"context"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// Notifier tells systemd how a Type=notify service is (sd_notify): ready,
// what it is doing, and alive. Where systemd did not ask (no NOTIFY_SOCKET
// in the environment) each call does nothing, so the same binary runs
// from a shell. The environment is left as it is: a host re-executing
// itself after its upgrade keeps the same pid, and tells systemd again.
type Notifier struct{}

// Ready says the service is up, with a line saying how (STATUS=).
func (Notifier) Ready(status string) { notify("READY=1\nSTATUS=" + oneLine(status)) }

// Status says what the service is doing now.
func (Notifier) Status(status string) { notify("STATUS=" + oneLine(status)) }

// Stopping says the service is ending on purpose.
func (Notifier) Stopping() { notify("STOPPING=1") }

// Alive pings the watchdog.
func (Notifier) Alive() { notify(daemon.SdNotifyWatchdog) }

// WatchdogEvery is how often to ping the watchdog: half of WATCHDOG_USEC
// when systemd set it for this process (WatchdogSec=), else 0.
func (Notifier) WatchdogEvery() time.Duration {
	d, err := daemon.SdWatchdogEnabled(false)
	if err != nil || d <= 0 {
		return 0
	}
	return d / 2
}

// notify sends one message; an error is dropped, since a service that
// cannot reach systemd's socket can only go on (and systemd, missing the
// message, is the one that acts: a start timeout, a watchdog restart).
func notify(state string) { _, _ = daemon.SdNotify(false, state) }

// oneLine keeps a status to one line: a line break would end the field.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// Watch pings the watchdog every WatchdogEvery until ctx ends; it returns
// at once where systemd set no watchdog. It proves the process is
// scheduled and not wedged in its runtime; a loop that should prove more
// pings with Alive itself.
func (n Notifier) Watch(ctx context.Context) {
	every := n.WatchdogEvery()
	if every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	n.Alive()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n.Alive()
		}
	}
}
