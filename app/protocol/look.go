package protocol

import "time"

// LookInbox is the last tokens of the subject the controller asks a host
// for a live look on (mesh.node.N.inbox.look): what runs on the machine now
// beside what a module declares, for take. Only controller users may
// publish there and only node N's host reads it; the host answers on the
// request's reply subject (AnswerSubject) with a LookAnswer signed by its
// host key, like every host message.
const LookInbox = "inbox.look"

// Bounds of a look: an ask or an answer larger than these is refused, and
// a data path's walk stops after MaxLookEntries entries (its size is then
// "at least").
const (
	MaxLookPorts   = 64
	MaxLookData    = 64
	MaxLookEntries = 200000
	// MaxLookHolders bounds the holders named for one port, and the
	// processes named for a module's name.
	MaxLookHolders = 16
	// MaxLookSockets bounds the sockets an answer names: with the other
	// bounds, an answer stays well under a host's largest message (1 MiB).
	MaxLookSockets = 256
)

// LookAsk is what a module declares, as the controller asks a host to look
// for it: its name, its ports, its data paths.
type LookAsk struct {
	Module string         `json:"module"`
	Ports  []Port         `json:"ports"`
	Data   []DeclaredData `json:"data"`
}

// LookAnswer is what a host saw, now.
type LookAnswer struct {
	Error string `json:"error,omitempty"`
	// Ports are the sockets listening on a declared port, each with its
	// holder (TCP and UDP, v4 and v6).
	Ports []LookPort `json:"ports"`
	// Data are the declared data paths as they are under the host's root.
	Data []LookData `json:"data"`
	// Units are the active systemd units of the module's name.
	Units []string `json:"units"`
	// Processes are the processes of the module's name.
	Processes []LookProcess `json:"processes"`
	// Systemd says whether systemd runs there, and why the host thinks so.
	Systemd    bool   `json:"systemd"`
	SystemdWhy string `json:"systemd_why"`
}

// LookPort is one socket listening on a declared port.
type LookPort struct {
	Name    string `json:"name"`  // the port's name in the manifest
	Port    int    `json:"port"`  // its number
	Proto   string `json:"proto"` // tcp or udp
	Address string `json:"address"`
	// Holders are the processes holding the socket (none seen: the host
	// may not see another user's processes).
	Holders []LookProcess `json:"holders"`
}

// LookProcess is one process on the machine.
type LookProcess struct {
	Pid     int    `json:"pid"`
	Command string `json:"command"`
	// Unit is the systemd unit it runs in, from /proc/<pid>/cgroup.
	Unit string `json:"unit,omitempty"`
}

// LookData is one declared data path as the host found it.
type LookData struct {
	Name   string `json:"name"`
	Path   string `json:"path"`
	Exists bool   `json:"exists"`
	// Symlink is where a path that is a symbolic link points: take refuses
	// it (the mesh does not follow a link out of what it was shown).
	Symlink string `json:"symlink,omitempty"`
	Dir     bool   `json:"dir,omitempty"`
	Bytes   int64  `json:"bytes"`
	Entries int    `json:"entries"`
	// Partial says the walk stopped at MaxLookEntries (or at what it could
	// not read): Bytes is then at least that.
	Partial bool `json:"partial,omitempty"`
}

// TakeGrace is how long a process a cutover stops has between SIGTERM and
// SIGKILL.
const TakeGrace = 10 * time.Second

// DeclaredTake is the cutover of a module taken onto an adopted node, as a
// person approved it (take --yes): before its host starts the module for
// the first time it stops and disables these units and stops these
// processes (each only if its pid still runs that command: SIGTERM, then
// SIGKILL after the grace). The module's data paths are never touched.
type DeclaredTake struct {
	Digest    string        `json:"digest"`
	Module    string        `json:"module"`
	Processes []TakeProcess `json:"processes,omitempty"`
	Units     []string      `json:"units,omitempty"`
}

// TakeProcess is one process a cutover stops.
type TakeProcess struct {
	Command string `json:"command"`
	Pid     int    `json:"pid"`
}
