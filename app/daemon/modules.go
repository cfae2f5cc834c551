package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"

	"mesh-controller/app/archive"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/health"
)

// Bounds on what a host reports of its modules: a report past them is cut,
// never stored whole.
const (
	maxModuleStates = protocol.MaxModules
	maxLogTail      = 20
)

// absorbModules takes a node's module states from a heartbeat or an apply
// report: written at the next flush only when they changed, a module that
// became ready for the node's latest declaration measured as a start
// (declared → ready, on the controller's clock). It says whether a state
// changed (a self-check soon).
//
// hostAt is when the host read the states, on its clock, and report says
// they come from an apply report: beats arrive in order and are always
// taken, but a report is kept by the outcome writer beside them, and one
// handed over after a later beat would put a module back to starting
// after it was ready (a roll-out's soak then failed it). A report read
// before the last beat's states is dropped; a host that does not say
// when is taken as before. A host's clock set back only delays reports
// until its next beat.
func (d *daemon) absorbModules(_ context.Context, node string, at, hostAt time.Time, report bool, ms []protocol.ModuleState) bool {
	if !hostAt.IsZero() {
		if report && hostAt.Before(d.statesAt[node]) {
			return false
		}
		d.statesAt[node] = hostAt
	}
	if len(ms) > maxModuleStates {
		ms = ms[:maxModuleStates]
	}
	states := make([]health.ModuleState, 0, len(ms))
	declaredAt := map[string]time.Time{}
	for _, m := range ms {
		declaredAt[m.Module] = m.DeclaredAt
		if !protocol.ValidName(m.Module) {
			continue
		}
		tail := m.LogTail
		if len(tail) > maxLogTail {
			tail = tail[len(tail)-maxLogTail:]
		}
		for i := range tail {
			tail[i] = clip(tail[i])
		}
		digest := m.Archive
		if !archive.IsDigest(digest) {
			digest = "" // a host's word, kept only when it is a digest
		}
		states = append(states, health.ModuleState{Node: node, Module: m.Module, Version: clip(m.Version), Archive: digest, State: clip(m.State), Serial: m.Serial,
			Pid: m.Pid, Since: m.Since, Restarts1h: m.Restarts1h, LastExit: clip(m.LastExit), Detail: clip(m.Detail), LogTail: tail, HeardAt: at})
	}
	// A quiet module reports the same state, pid and since each beat: only
	// a change is written (when it was heard is not part of the digest).
	b, _ := json.Marshal(ms)
	sum := sha256.Sum256(b)
	digest := hex.EncodeToString(sum[:])
	was, heard := d.moduleStates[node]
	if was == digest {
		return false
	}
	d.moduleStates[node] = digest
	d.modulesDue[node] = states
	for _, m := range states {
		key := node + "/" + m.Module
		was, seen := d.lastState[key]
		d.lastState[key] = m.State
		// Only a change to ready this controller saw is a start: a module
		// found ready (serve started again, say) was declared long ago.
		if m.State != protocol.StateReady || !seen || was == protocol.StateReady || d.readyFor[key] == m.Serial || m.Serial == 0 {
			continue
		}
		d.readyFor[key] = m.Serial
		if declared := declaredAt[m.Module]; !declared.IsZero() && declared.Before(at) {
			d.durations = append(d.durations, health.Duration{Kind: "start", Subject: key, MS: float64(at.Sub(declared).Microseconds()) / 1000, At: at})
		}
	}
	// The first report since serve started of a node that runs nothing is
	// written, but does not call for a self-check: ten thousand hosts
	// joining, or back after a restart, would have it judge the whole mesh
	// back to back (11 s of the controller's 71 s over 10,000 joins).
	return heard || len(states) > 0
}
