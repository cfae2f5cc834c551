package host

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"mesh-controller/app/protocol"
)

// procRoot is where the kernel shows processes and sockets.
const procRoot = "/proc"

// socket is one listening socket as /proc/net shows it.
type socket struct {
	proto string // tcp or udp
	ip    string
	port  int
	inode string
	file  string // the /proc/net file it was read from
}

// listeningSockets reads every listening TCP socket and every bound UDP
// socket, v4 and v6.
func listeningSockets() []socket {
	var out []socket
	for _, f := range []struct{ proto, file string }{
		{"tcp", "net/tcp"}, {"tcp", "net/tcp6"}, {"udp", "net/udp"}, {"udp", "net/udp6"},
	} {
		out = append(out, readSockets(f.proto, filepath.Join(procRoot, f.file))...)
	}
	return out
}

// readSockets reads one /proc/net table: TCP sockets in LISTEN (0A), UDP
// sockets unconnected (07, with no remote port).
func readSockets(proto, file string) []socket {
	f, err := os.Open(file)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []socket
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 {
			continue
		}
		switch {
		case proto == "tcp" && fields[3] == "0A": // TCP_LISTEN
		case proto == "udp" && fields[3] == "07" && strings.HasSuffix(fields[2], ":0000"):
		default:
			continue
		}
		ipHex, portHex, ok := strings.Cut(fields[1], ":")
		if !ok {
			continue
		}
		port, err := strconv.ParseUint(portHex, 16, 16)
		if err != nil {
			continue
		}
		out = append(out, socket{proto: proto, ip: hexIP(ipHex), port: int(port), inode: fields[9], file: file})
	}
	return out
}

// socketHolders maps socket inodes to the processes holding them, from
// each process's /proc/<pid>/fd links (socket:[inode]). Processes this host
// may not read (another user's, as non-root) are not seen.
func socketHolders() map[string][]protocol.LookProcess {
	out := map[string][]protocol.LookProcess{}
	for _, pid := range pids() {
		fds := filepath.Join(procRoot, strconv.Itoa(pid), "fd")
		ents, err := os.ReadDir(fds)
		if err != nil {
			continue
		}
		var p *protocol.LookProcess
		seen := map[string]bool{}
		for _, e := range ents {
			link, err := os.Readlink(filepath.Join(fds, e.Name()))
			if err != nil {
				continue
			}
			inode, ok := strings.CutPrefix(link, "socket:[")
			if !ok || seen[inode] {
				continue
			}
			seen[inode] = true
			if p == nil {
				one := processOf(pid)
				p = &one
			}
			out[strings.TrimSuffix(inode, "]")] = append(out[strings.TrimSuffix(inode, "]")], *p)
		}
	}
	return out
}

// pids lists the processes under /proc, in order.
func pids() []int {
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid > 0 {
			out = append(out, pid)
		}
	}
	sort.Ints(out)
	return out
}

// processOf is a process's pid, command (/proc/<pid>/comm) and systemd unit.
func processOf(pid int) protocol.LookProcess {
	return protocol.LookProcess{Pid: pid, Command: commandOf(pid), Unit: unitOf(pid)}
}

// commandOf is the name the kernel keeps for a process (comm, at most 15
// bytes), or "" if it is gone.
func commandOf(pid int) string {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "comm"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// unitOf is the systemd service a process runs in, from the last part of
// its cgroup path (0::/system.slice/postgresql.service), or "".
func unitOf(pid int) string {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || (parts[0] != "0" && parts[1] != "name=systemd") {
			continue
		}
		for _, seg := range strings.Split(parts[2], "/") {
			if strings.HasSuffix(seg, ".service") && !strings.HasPrefix(seg, "user@") {
				return seg
			}
		}
	}
	return ""
}

// running says whether pid runs command now: not gone, not a zombie, and
// the same comm.
func running(pid int, command string) bool {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	// pid (comm) S …: the state follows the last ')'.
	if i := bytes.LastIndexByte(b, ')'); i < 0 || i+2 >= len(b) || b[i+2] == 'Z' || b[i+2] == 'X' {
		return false
	}
	return commandOf(pid) == command
}

// processesNamed are the processes whose comm is name (as the kernel keeps
// it, cut to 15 bytes), this host's own process aside.
func processesNamed(name string) []protocol.LookProcess {
	if len(name) > 15 {
		name = name[:15]
	}
	var out []protocol.LookProcess
	for _, pid := range pids() {
		if pid == os.Getpid() || commandOf(pid) != name {
			continue
		}
		out = append(out, processOf(pid))
		if len(out) == protocol.MaxLookHolders {
			break
		}
	}
	return out
}

// systemdRuns says whether systemd is the init system here, and why the
// host thinks so (sd_booted's test: /run/systemd/system exists).
func systemdRuns() (bool, string) {
	if fi, err := os.Stat("/run/systemd/system"); err == nil && fi.IsDir() {
		if _, err := exec.LookPath("systemctl"); err != nil {
			return false, "/run/systemd/system exists but systemctl is not on PATH"
		}
		return true, "/run/systemd/system exists"
	}
	return false, "/run/systemd/system does not exist: systemd is not this machine's init"
}

// activeUnits lists the active service units (systemctl list-units), or
// why it could not.
func activeUnits() ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), protocol.AnswerTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "systemctl", "list-units", "--type=service", "--state=active", "--plain", "--no-legend", "--no-pager").Output()
	if err != nil {
		return nil, fmt.Errorf("systemctl list-units: %w", err)
	}
	var units []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasSuffix(f[0], ".service") {
			units = append(units, f[0])
		}
	}
	return units, nil
}

// stopUnit stops and disables a unit, as a take's cutover does.
func stopUnit(unit string) error {
	for _, verb := range []string{"stop", "disable"} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		out, err := exec.CommandContext(ctx, "systemctl", verb, "--", unit).CombinedOutput()
		cancel()
		if err != nil {
			return fmt.Errorf("systemctl %s %s: %v: %s", verb, unit, err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}
