package host

import (
	"fmt"
	"slices"
	"syscall"
	"time"

	"mesh-controller/app/protocol"
)

// cutover does each declared cutover not done before (done: their
// digests): stop and disable its units, stop its processes, each only if
// its pid still runs the command the person was shown. It returns the
// digests done that are still declared.
func cutover(takes []protocol.DeclaredTake, done []string) ([]string, error) {
	var out []string
	for _, tk := range takes {
		if !slices.Contains(done, tk.Digest) {
			for _, u := range tk.Units {
				if err := stopUnit(u); err != nil {
					return nil, fmt.Errorf("take of %s: %w", tk.Module, err)
				}
			}
			for _, p := range tk.Processes {
				if err := stopProcess(p); err != nil {
					return nil, fmt.Errorf("take of %s: %w", tk.Module, err)
				}
			}
		}
		out = append(out, tk.Digest)
	}
	return out, nil
}

// stopProcess ends pid if it still runs command: SIGTERM, then SIGKILL
// after protocol.TakeGrace. A pid gone, or running something else now, is left
// alone: it is not what the person approved stopping.
func stopProcess(p protocol.TakeProcess) error {
	if !running(p.Pid, p.Command) {
		return nil
	}
	if err := syscall.Kill(p.Pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop pid %d (%s): %w", p.Pid, p.Command, err)
	}
	if gone(p, protocol.TakeGrace) {
		return nil
	}
	if err := syscall.Kill(p.Pid, syscall.SIGKILL); err != nil && err != syscall.ESRCH {
		return fmt.Errorf("kill pid %d (%s): %w", p.Pid, p.Command, err)
	}
	if !gone(p, 5*time.Second) {
		return fmt.Errorf("pid %d (%s) still runs after SIGKILL", p.Pid, p.Command)
	}
	return nil
}

// gone waits up to within for a process to end.
func gone(p protocol.TakeProcess, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for running(p.Pid, p.Command) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}
