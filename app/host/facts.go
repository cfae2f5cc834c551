package host

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"mesh-controller/app/protocol"
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
	return protocol.FactsBody{Facts: facts, Found: listening()}
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

// listening reads the TCP sockets in LISTEN state from /proc/net/tcp{,6}.
func listening() []protocol.Found {
	found := []protocol.Found{}
	seen := map[string]bool{}
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		for _, addr := range listenAddrs(file) {
			name := "tcp/" + addr.port
			if seen[name+addr.ip] {
				continue
			}
			seen[name+addr.ip] = true
			found = append(found, protocol.Found{Kind: "port", Name: name,
				Detail: fmt.Sprintf("listening on %s:%s (%s)", addr.ip, addr.port, file)})
		}
	}
	return found
}

type sockAddr struct{ ip, port string }

func listenAddrs(file string) []sockAddr {
	f, err := os.Open(file)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []sockAddr
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || fields[3] != "0A" { // 0A is TCP_LISTEN
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
		out = append(out, sockAddr{ip: hexIP(ipHex), port: strconv.FormatUint(port, 10)})
	}
	return out
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
