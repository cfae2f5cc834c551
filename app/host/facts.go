package host

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"mesh-controller/app/protocol"
	"mesh-controller/app/restic"
)

// Facts reports what this machine can do, each with the evidence it was read
// from, and what it found listening beside the mesh's modules.
func Facts(root string) protocol.FactsBody {
	facts := []protocol.Fact{
		{Name: "arch", Value: runtime.GOARCH, Why: "the host binary's GOARCH"},
		{Name: "os", Value: runtime.GOOS, Why: "the host binary's GOOS"},
		{Name: "cores", Value: strconv.Itoa(runtime.NumCPU()), Why: "CPUs this process may run on (sched_getaffinity)"},
	}
	if name := osRelease(); name != "" {
		facts = append(facts, protocol.Fact{Name: "distribution", Value: name, Why: "PRETTY_NAME in /etc/os-release"})
	}
	if mb, ok := memoryMB(); ok {
		facts = append(facts, protocol.Fact{Name: "memory_mb", Value: strconv.FormatInt(mb, 10), Why: "MemTotal in /proc/meminfo"})
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(root, &st); err == nil {
		free := int64(st.Bavail) * st.Bsize / (1 << 20)
		facts = append(facts, protocol.Fact{Name: "disk_free_mb", Value: strconv.FormatInt(free, 10), Why: "statfs of the root " + root})
	}
	if h, err := os.Hostname(); err == nil {
		facts = append(facts, protocol.Fact{Name: "hostname", Value: h, Why: "gethostname"})
	}
	facts = append(facts, resticFact())
	fs, more := found()
	return protocol.FactsBody{Facts: append(facts, more...), Found: fs}
}

// resticSeen is the restic last asked its version: asked again only when
// the program on the PATH changed, not at every look at the machine.
var resticSeen struct {
	sync.Mutex
	key  string
	fact protocol.Fact
}

// resticFact is the restic this host backs up and restores with: its
// version, or "" with why (the controller says to install it on a node
// with precious data).
func resticFact() protocol.Fact {
	prog, err := exec.LookPath("restic")
	if err != nil {
		return protocol.Fact{Name: protocol.FactRestic, Value: "", Why: "restic not found on PATH"}
	}
	key := prog
	if fi, err := os.Stat(prog); err == nil {
		key = fmt.Sprintf("%s %d %d", prog, fi.Size(), fi.ModTime().UnixNano())
	}
	resticSeen.Lock()
	defer resticSeen.Unlock()
	if resticSeen.key == key {
		return resticSeen.fact
	}
	ctx, cancel := context.WithTimeout(context.Background(), protocol.AnswerTimeout)
	defer cancel()
	f := protocol.Fact{Name: protocol.FactRestic, Why: "restic version"}
	v, err := restic.Version(ctx)
	if err != nil {
		f.Why = err.Error()
	} else {
		f.Value = v
		resticSeen.key = key // a failure is asked again next time
	}
	resticSeen.fact = f
	return f
}

func osRelease() string {
	f, err := os.Open("/etc/os-release")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "PRETTY_NAME="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

func memoryMB() (int64, bool) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			return kb / 1024, err == nil
		}
	}
	return 0, false
}

// MaxFound bounds what a facts report finds (the controller refuses a
// report with more): sockets first, then units.
const MaxFound = 1000

// found is every listening TCP and UDP socket (v4 and v6) with the process
// holding it, and the active systemd units, or why they are not said.
func found() ([]protocol.Found, []protocol.Fact) {
	out := []protocol.Found{}
	holders := socketHolders()
	seen := map[string]bool{}
	for _, s := range listeningSockets() {
		name := fmt.Sprintf("%s/%d", s.proto, s.port)
		hs := holders[s.inode]
		if len(hs) == 0 {
			hs = []protocol.LookProcess{{}}
		}
		for _, h := range hs {
			key := fmt.Sprintf("%s %s %d", name, s.ip, h.Pid)
			if seen[key] || len(out) >= MaxFound {
				continue
			}
			seen[key] = true
			detail := fmt.Sprintf("listening on %s:%d (%s)", s.ip, s.port, s.file)
			if h.Pid != 0 {
				detail += fmt.Sprintf(", held by pid %d (%s)", h.Pid, h.Command)
				if h.Unit != "" {
					detail += " in " + h.Unit
				}
			} else {
				detail += ", its holder not visible to the host"
			}
			out = append(out, protocol.Found{Kind: "port", Name: name, Detail: detail, Address: s.ip, Pid: h.Pid, Command: h.Command, Unit: h.Unit})
		}
	}
	runs, why := systemdRuns()
	facts := []protocol.Fact{{Name: "systemd", Value: strconv.FormatBool(runs), Why: why}}
	if f, ok := sshPort(out); ok {
		facts = append(facts, f)
	}
	if !runs {
		return out, facts
	}
	units, err := activeUnits()
	if err != nil {
		return out, append(facts, protocol.Fact{Name: "systemd_units", Value: "unknown", Why: err.Error()})
	}
	for _, u := range units {
		if len(out) >= MaxFound {
			break
		}
		out = append(out, protocol.Found{Kind: "service", Name: u, Detail: "active (systemctl list-units --type=service --state=active)", Unit: u})
	}
	return out, facts
}

// sshPort is the fact of the port SSH is reached on here: the lowest TCP
// port sshd listens on. None is said when no sshd is seen listening (not
// running, or another user's process as non-root): the filter then keeps
// its default open.
func sshPort(found []protocol.Found) (protocol.Fact, bool) {
	best := 0
	var by protocol.Found
	for _, f := range found {
		port, ok := strings.CutPrefix(f.Name, "tcp/")
		if f.Kind != "port" || !ok || f.Command != "sshd" {
			continue
		}
		if n, err := strconv.Atoi(port); err == nil && (best == 0 || n < best) {
			best, by = n, f
		}
	}
	if best == 0 {
		return protocol.Fact{}, false
	}
	return protocol.Fact{Name: protocol.FactSSHPort, Value: strconv.Itoa(best),
		Why: fmt.Sprintf("sshd (pid %d) listens on tcp/%d at %s", by.Pid, best, by.Address)}, true
}

// hexIP turns /proc/net's little-endian hex address into text.
func hexIP(h string) string {
	if len(h) == 8 {
		v, err := strconv.ParseUint(h, 16, 32)
		if err != nil {
			return h
		}
		return fmt.Sprintf("%d.%d.%d.%d", byte(v), byte(v>>8), byte(v>>16), byte(v>>24))
	}
	if strings.Trim(h, "0") == "" {
		return "[::]"
	}
	if h == "00000000000000000000000001000000" {
		return "[::1]"
	}
	return "[" + h + "]"
}
