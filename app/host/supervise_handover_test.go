package host

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"mesh-controller/app/protocol"
)

// A supervisor hands its running modules over and another adopts them, as
// a host re-executing itself does (here in one process, its children the
// same): the same process, ready, its log going on through the pipe it
// had, its restarts counted on; a module not ready yet goes on with its
// ready check; an adopted module that exits is reaped and restarted, and
// one stopped is stopped as any other. Sweep leaves an adopted module
// alone.
func TestSupervisor_HandoverAndAdopt(t *testing.T) {
	t.Parallel()
	old, _ := newSup(t)
	dir := t.TempDir()
	talk := script(t, dir, "talk.sh", `echo "start $$"; while :; do if [ -e "$HOME/say" ]; then echo said; rm "$HOME/say"; fi; if [ -e "$HOME/quit" ]; then rm "$HOME/quit"; exit 3; fi; sleep 0.05; done`+"\n")
	slow := testSpec("slow", dir, "sleep", "1000")
	slow.Ready = &protocol.Ready{After: "1500ms"}
	old.Apply([]ModuleSpec{testSpec("talk", dir, talk), slow})
	ready := waitState(t, old, "talk", protocol.StateReady)
	waitState(t, old, "slow", protocol.StateStarting)
	slowPid := stateOfPid(t, old, "slow")

	handed := old.Handover()
	if len(handed) != 2 {
		t.Fatalf("handed over %d modules: %+v", len(handed), handed)
	}
	if !alive(ready.Pid) || !alive(slowPid) {
		t.Fatal("a module handed over was stopped")
	}
	old.Apply([]ModuleSpec{testSpec("other", dir, "sleep", "1000")}) // after Handover: nothing
	if _, ok := stateOf(old, "other"); ok {
		t.Fatal("applied after Handover")
	}

	lb := &logBuf{}
	next := &Supervisor{StateDir: old.StateDir, LogDir: old.LogDir, BackoffBase: 20 * time.Millisecond, BackoffCap: 100 * time.Millisecond, Logf: lb.logf}
	t.Cleanup(next.StopAll)
	lines := next.Adopt(handed)
	if len(lines) != 2 || !strings.Contains(strings.Join(lines, "\n"), "module talk adopted: pid") {
		t.Fatalf("adopted: %q", lines)
	}
	if swept := next.Sweep(); len(swept) != 0 {
		t.Fatalf("Sweep ended adopted modules: %q", swept)
	}
	next.Apply([]ModuleSpec{testSpec("talk", dir, talk), slow}) // the same fingerprints: left running
	st, _ := stateOf(next, "talk")
	if st.State != protocol.StateReady || st.Pid != ready.Pid || !st.Since.Equal(ready.Since) {
		t.Fatalf("adopted: %+v, was %+v", st, ready)
	}
	// The module's output reaches its log through the pipe handed over.
	if err := os.WriteFile(filepath.Join(dir, "say"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		lines, _ := next.Tail("talk", 20)
		if !strings.Contains(strings.Join(lines, "\n"), "said") {
			return fmt.Errorf("its log after the handover: %q", lines)
		}
		return nil
	})
	// The one not ready yet becomes ready, still the same process.
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if st, _ := stateOf(next, "slow"); st.State != protocol.StateReady || st.Pid != slowPid {
			return fmt.Errorf("slow: %+v (pid was %d)", st, slowPid)
		}
		return nil
	})
	// Handed over again (an upgrade after an upgrade), and adopted again.
	again := &Supervisor{StateDir: old.StateDir, LogDir: old.LogDir, BackoffBase: 20 * time.Millisecond, BackoffCap: 100 * time.Millisecond}
	t.Cleanup(again.StopAll)
	if lines := again.Adopt(next.Handover()); len(lines) != 2 || strings.Contains(strings.Join(lines, "\n"), "not adopted") {
		t.Fatalf("adopted again: %q", lines)
	}
	if n := lb.count("log pipe"); n > 0 {
		t.Fatalf("an adopted module's log pipe was not handed over cleanly: %q", lb.lines)
	}
	next = again
	again.Apply([]ModuleSpec{testSpec("talk", dir, talk), slow})
	// Exiting, it is reaped and restarted, its exit said as for any run.
	if err := os.WriteFile(filepath.Join(dir, "quit"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		st, _ := stateOf(next, "talk")
		if st.Pid == ready.Pid || st.Pid == 0 || st.LastExit != "exit status 3" || st.Restarts1h != 1 {
			return fmt.Errorf("after the adopted run exited: %+v", st)
		}
		return nil
	})
	waitDead(t, ready.Pid)
	next.StopAll()
	waitDead(t, slowPid)
}

// stateOfPid is module's pid as s reports it.
func stateOfPid(t *testing.T, s *Supervisor, module string) int {
	t.Helper()
	st, ok := stateOf(s, module)
	if !ok || st.Pid == 0 {
		t.Fatalf("%s has no pid: %+v", module, st)
	}
	return st.Pid
}
