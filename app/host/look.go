package host

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"mesh-controller/app/protocol"
)

// MaxLookAsk bounds a look's ask as the host reads it.
const MaxLookAsk = 64 << 10

// answerLook answers the controller's live look (protocol.LookInbox),
// signed with the host key like every host message.
func (r *Runner) answerLook(m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	var ask protocol.LookAsk
	var a protocol.LookAnswer
	switch {
	case len(m.Data) > MaxLookAsk:
		a.Error = "the ask is too large"
	case json.Unmarshal(m.Data, &ask) != nil:
		a.Error = "the ask is not JSON"
	case !protocol.ValidName(ask.Module) || len(ask.Ports) > protocol.MaxLookPorts || len(ask.Data) > protocol.MaxLookData:
		a.Error = "the ask names no valid module, or too many ports or data paths"
	default:
		a = Look(r.Root, ask)
	}
	b, err := protocol.Sign(r.State.HostKey, a)
	if err == nil {
		err = m.Respond(b)
	}
	if err != nil {
		r.warnf("answer a look: %v", err)
	}
}

// Look sees what runs on this machine now beside what a module declares:
// who holds each of its ports, each of its data paths under root (a
// bounded walk), and the units and processes of its name.
func Look(root string, ask protocol.LookAsk) protocol.LookAnswer {
	a := protocol.LookAnswer{Ports: []protocol.LookPort{}, Data: []protocol.LookData{}, Units: []string{}, Processes: []protocol.LookProcess{}}
	wanted := map[int]string{}
	for _, p := range ask.Ports {
		wanted[p.Port] = p.Name
	}
	holders := socketHolders()
	for _, s := range listeningSockets() {
		name, ok := wanted[s.port]
		if !ok || len(a.Ports) == protocol.MaxLookSockets {
			continue
		}
		hs := holders[s.inode]
		if len(hs) > protocol.MaxLookHolders {
			hs = hs[:protocol.MaxLookHolders]
		}
		a.Ports = append(a.Ports, protocol.LookPort{Name: name, Port: s.port, Proto: s.proto, Address: s.ip, Holders: append([]protocol.LookProcess{}, hs...)})
	}
	sort.SliceStable(a.Ports, func(i, j int) bool {
		x, y := a.Ports[i], a.Ports[j]
		if x.Port != y.Port {
			return x.Port < y.Port
		}
		if x.Proto != y.Proto {
			return x.Proto < y.Proto
		}
		return x.Address < y.Address
	})
	for _, d := range ask.Data {
		a.Data = append(a.Data, lookData(root, d))
	}
	a.Systemd, a.SystemdWhy = systemdRuns()
	if a.Systemd {
		units, err := activeUnits()
		if err != nil {
			a.SystemdWhy += "; " + err.Error()
		}
		for _, u := range units {
			if u == ask.Module+".service" {
				a.Units = append(a.Units, u)
			}
		}
	}
	a.Processes = append(a.Processes, processesNamed(ask.Module)...)
	return a
}

// lookData is one data path as it is under root: a symbolic link is named
// and not followed; a directory is walked, at most MaxLookEntries entries.
func lookData(root string, d protocol.DeclaredData) protocol.LookData {
	out := protocol.LookData{Name: d.Name, Path: d.Path}
	if !protocol.ValidDataPath(d.Path) {
		out.Partial = true
		return out
	}
	full := filepath.Join(root, filepath.FromSlash(d.Path))
	// A link on the way to it is a link too: the walk would leave the path.
	for p := full; len(p) > len(root); p = filepath.Dir(p) {
		if fi, err := os.Lstat(p); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
			target, _ := os.Readlink(p)
			out.Exists, out.Symlink = true, target
			if p != full {
				out.Symlink = strings.TrimPrefix(p, root) + " -> " + target
			}
			return out
		}
	}
	fi, err := os.Lstat(full)
	if err != nil {
		out.Partial = !errors.Is(err, fs.ErrNotExist)
		return out
	}
	out.Exists, out.Dir = true, fi.IsDir()
	if !fi.IsDir() {
		out.Bytes, out.Entries = fi.Size(), 1
		return out
	}
	deadline := time.Now().Add(protocol.AnswerTimeout / 2)
	stop := errors.New("stop")
	err = filepath.WalkDir(full, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			out.Partial = true
			return nil
		}
		if out.Entries >= protocol.MaxLookEntries || time.Now().After(deadline) {
			out.Partial = true
			return stop
		}
		out.Entries++
		if e.Type().IsRegular() {
			if info, err := e.Info(); err == nil {
				out.Bytes += info.Size()
			}
		}
		return nil
	})
	if err != nil && err != stop {
		out.Partial = true
	}
	return out
}
