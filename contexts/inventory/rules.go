package inventory

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// The rules over the inventory: pure functions of a snapshot (and a node's
// facts), no store and no I/O, so that assign, unassign, seats, pins and
// plans judge the mesh the same way.

// Provides says whether a manifest provides a provision.
func Provides(m Manifest, provision string) bool {
	return slices.ContainsFunc(m.Provides, func(p Provision) bool { return p.Provision == provision })
}

// ProvidersOf lists the assignments providing a provision, by node/module.
func (s *Snapshot) ProvidersOf(provision string) []Holder {
	var out []Holder
	for _, a := range s.Assignments {
		if Provides(s.Manifests[a.Module][a.Version], provision) {
			out = append(out, Holder{Node: a.Node, Module: a.Module})
		}
	}
	slices.SortFunc(out, func(a, b Holder) int { return strings.Compare(a.String(), b.String()) })
	return out
}

// ManifestOn is the manifest of a module as assigned on a node (zero if it
// is not assigned there).
func (s *Snapshot) ManifestOn(h Holder) Manifest {
	return s.Manifests[h.Module][s.VersionOn(h.Node, h.Module)]
}

// KeepsPrecious says a provider keeps irreplaceable or costly data per
// consumer of a provision: its bindings do not move while it lives.
func (s *Snapshot) KeepsPrecious(h Holder, provision string) (string, bool) {
	for _, p := range s.ManifestOn(h).Provides {
		if p.Provision == provision && p.PerConsumer != nil && p.PerConsumer.Data != nil &&
			(p.PerConsumer.Data.Precious == Irreplaceable || p.PerConsumer.Data.Precious == Costly) {
			return p.PerConsumer.Data.Precious, true
		}
	}
	return "", false
}

// GivesCredential says a provider gives each consumer of a provision a
// credential of its own.
func (s *Snapshot) GivesCredential(h Holder, provision string) bool {
	for _, p := range s.ManifestOn(h).Provides {
		if p.Provision == provision && p.PerConsumer != nil && p.PerConsumer.Credential {
			return true
		}
	}
	return false
}

// CredentialName is the secret a provider keeps for one consumer's credential.
func CredentialName(consumerNode, consumerModule, provision string) string {
	return "consumer." + consumerNode + "." + consumerModule + "." + provision
}

// BindingKey names one consumer's need: node/module/provision.
func BindingKey(node, module, provision string) string { return node + "/" + module + "/" + provision }

// SplitBindingKey is BindingKey's inverse.
func SplitBindingKey(key string) (node, module, provision string) {
	node, rest, _ := strings.Cut(key, "/")
	module, provision, _ = strings.Cut(rest, "/")
	return node, module, provision
}

// Choice is a binding chosen, and why it is that one.
type Choice struct {
	Provider Holder
	Why      string
}

// ChooseBindings decides every consumer's provider, keyed by BindingKey: a
// pin; else the current binding while it is valid (stickiness); else a
// provider on the same node; else the one with the fewest consumers; ties
// by name.
func (s *Snapshot) ChooseBindings() map[string]Choice {
	out := map[string]Choice{}
	load := map[Holder]int{}
	type need struct{ node, module, provision string }
	var needs []need
	for _, a := range s.Assignments {
		for _, n := range s.Manifests[a.Module][a.Version].Needs {
			needs = append(needs, need{a.Node, a.Module, n.Provision})
		}
	}
	providers := map[string][]Holder{}
	candidates := func(provision string) []Holder {
		if c, ok := providers[provision]; ok {
			return c
		}
		providers[provision] = s.ProvidersOf(provision)
		return providers[provision]
	}
	// First the needs already decided (pinned or sticky), so the loads of
	// the rest count them.
	var pending []need
	for _, n := range needs {
		cands := candidates(n.provision)
		key := BindingKey(n.node, n.module, n.provision)
		if p, ok := s.Seats.Pins[n.node+"/"+n.provision]; ok && slices.Contains(cands, p.Provider) {
			out[key] = Choice{p.Provider, "pinned by a person"}
		} else if b, ok := s.Seats.Bindings[key]; ok && slices.Contains(cands, b.Provider) {
			why := "bound since " + b.Since.Format("2006-01-02") + " (bindings are sticky)"
			if level, precious := s.KeepsPrecious(b.Provider, n.provision); precious {
				why = fmt.Sprintf("bound since %s; it keeps %s data for this consumer, so only a pin moves it", b.Since.Format("2006-01-02"), level)
			}
			out[key] = Choice{b.Provider, why}
		} else {
			pending = append(pending, n)
			continue
		}
		load[out[key].Provider]++
	}
	for _, n := range pending {
		cands := candidates(n.provision)
		if len(cands) == 0 {
			continue
		}
		var pick Holder
		why := ""
		for _, c := range cands {
			if c.Node == n.node {
				pick, why = c, "a provider on the same node"
				break
			}
		}
		if why == "" {
			pick, why = cands[0], "the provider with the fewest consumers"
			for _, c := range cands[1:] {
				if load[c] < load[pick] {
					pick = c
				}
			}
		}
		out[BindingKey(n.node, n.module, n.provision)] = Choice{pick, why}
		load[pick]++
	}
	return out
}

// JudgeRequirements judges a module's requirements against a node's facts:
// problems for facts that contradict it, unverified for facts not reported.
func JudgeRequirements(m Manifest, node string, facts map[string]Fact) (problems, unverified []string) {
	r := m.Requires
	if r == nil {
		return nil, nil
	}
	atLeast := func(req string, want int64, fact string) {
		if want <= 0 {
			return
		}
		f, ok := facts[fact]
		if !ok {
			unverified = append(unverified, fmt.Sprintf("%s >= %d", req, want))
			return
		}
		have, err := strconv.ParseInt(f.Value, 10, 64)
		if err != nil || have < want {
			problems = append(problems, fmt.Sprintf("%s requires %s >= %d, %s has %s (%s)", m.Module, req, want, node, f.Value, f.Why))
		}
	}
	if len(r.Arch) > 0 {
		if f, ok := facts["arch"]; !ok {
			unverified = append(unverified, "arch in "+strings.Join(r.Arch, "|"))
		} else if !slices.Contains(r.Arch, f.Value) {
			problems = append(problems, fmt.Sprintf("%s requires arch %s, %s is %s (%s)", m.Module, strings.Join(r.Arch, " or "), node, f.Value, f.Why))
		}
	}
	atLeast("memory_mb", r.MemoryMB, "memory_mb")
	atLeast("cores", r.Cores, "cores")
	atLeast("disk_mb", r.DiskMB, "disk_free_mb")
	for _, rt := range r.Runtimes {
		f, ok := facts["runtimes"]
		switch {
		case !ok:
			unverified = append(unverified, "runtime "+rt)
		case !slices.Contains(strings.Split(f.Value, ","), rt):
			problems = append(problems, fmt.Sprintf("%s requires runtime %s, %s has %s (%s)", m.Module, rt, node, f.Value, f.Why))
		}
	}
	return problems, unverified
}

// PortClashes says which ports the modules being added to a node claim that
// a module already there (or another being added) claims too.
func PortClashes(node string, here map[string]Manifest, adding []Manifest) []string {
	claimed := map[int]string{}
	for _, name := range slices.Sorted(maps.Keys(here)) {
		for _, p := range here[name].Ports {
			claimed[p.Port] = name
		}
	}
	var problems []string
	for _, m := range adding {
		for _, p := range m.Ports {
			if other, ok := claimed[p.Port]; ok {
				problems = append(problems, fmt.Sprintf("%s and %s both claim port %d on %s", other, m.Module, p.Port, node))
				continue
			}
			claimed[p.Port] = m.Module
		}
	}
	return problems
}

// LastProvider says, for modules leaving a node, every consumer that would
// be left needing a provision no one else provides.
func (s *Snapshot) LastProvider(node string, leaving []string) []string {
	return s.LastProviders([]string{node}, leaving)
}

// LastProviders is LastProvider for the same modules leaving several nodes
// at once: a provision whose every provider leaves is judged as one.
func (s *Snapshot) LastProviders(nodes []string, leaving []string) []string {
	set := map[string]bool{}
	for _, n := range nodes {
		set[n] = true
	}
	gone := func(a Assignment) bool { return set[a.Node] && slices.Contains(leaving, a.Module) }
	var problems []string
	for _, node := range nodes {
		for _, m := range leaving {
			problems = append(problems, s.lastOf(node, m, gone)...)
		}
	}
	return problems
}

// lastOf judges module m leaving node, whatever else gone says leaves.
func (s *Snapshot) lastOf(node, m string, gone func(Assignment) bool) []string {
	v := s.VersionOn(node, m)
	if v == "" {
		return nil
	}
	var problems []string
	for _, prov := range s.Manifests[m][v].Provides {
		others := slices.ContainsFunc(s.Assignments, func(b Assignment) bool {
			return !gone(b) && Provides(s.Manifests[b.Module][b.Version], prov.Provision)
		})
		if others {
			continue
		}
		for _, b := range s.Assignments {
			if gone(b) {
				continue
			}
			for _, need := range s.Manifests[b.Module][b.Version].Needs {
				if need.Provision == prov.Provision && !need.Optional {
					problems = append(problems, fmt.Sprintf("%s/%s needs %s, which only %s/%s provides: unassign %s first, or assign another provider",
						b.Node, b.Module, prov.Provision, node, m, b.Module))
				}
			}
		}
	}
	return problems
}

// SeatView is one seat the registered manifests define.
type SeatView struct {
	Seat       string   `json:"seat"`
	Delivers   string   `json:"delivers"`
	Replicated bool     `json:"replicated"`
	Holders    []string `json:"holders"`
	// Aliases are former names that still resolve to it.
	Aliases []string `json:"aliases"`
	// Modules are the modules that can hold it.
	Modules []string `json:"modules"`
}

// SeatViews lists every seat any current manifest defines, with its holders.
func (s *Snapshot) SeatViews() []SeatView {
	byName := map[string]*SeatView{}
	for module, cur := range s.Current {
		for _, st := range s.Manifests[module][cur].Seats {
			name := s.Seats.SeatName(st.Seat)
			v, ok := byName[name]
			if !ok {
				v = &SeatView{Seat: name, Delivers: st.Delivers, Replicated: st.Replicated, Holders: []string{}, Aliases: []string{}}
				byName[name] = v
			}
			v.Modules = append(v.Modules, module)
		}
	}
	for alias, seat := range s.Seats.Aliases {
		if v, ok := byName[seat]; ok {
			v.Aliases = append(v.Aliases, alias)
		}
	}
	out := []SeatView{}
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		v := byName[name]
		for _, h := range s.Seats.Holders[name] {
			v.Holders = append(v.Holders, h.String())
		}
		slices.Sort(v.Modules)
		slices.Sort(v.Aliases)
		out = append(out, *v)
	}
	return out
}

// CanHold says a manifest defines a seat (by its current name).
func (s *Snapshot) CanHold(m Manifest, seat string) bool {
	return slices.ContainsFunc(m.Seats, func(st Seat) bool { return s.Seats.SeatName(st.Seat) == seat })
}

// SeatHolders are the holders of a seat (by its name or a former one).
func (s *Snapshot) SeatHolders(seat string) []Holder {
	return s.Seats.Holders[s.Seats.SeatName(seat)]
}

// BackupHolders names the assignments holding the backup seat now, joined
// by ", " ("" when no one holds it).
func (s *Snapshot) BackupHolders() string {
	var names []string
	for _, h := range s.SeatHolders("backup") {
		names = append(names, h.String())
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// HolderNodes are the nodes holding a seat: the backup seat's holders carry
// a backup line for every precious data set, so their plans follow them.
func (s *Snapshot) HolderNodes(seat string) []string {
	var out []string
	for _, h := range s.SeatHolders(seat) {
		out = append(out, h.Node)
	}
	return out
}
