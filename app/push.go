package app

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"

	"mesh-controller/app/daemon"
	"mesh-controller/app/plan"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/identity"
	"mesh-controller/contexts/inventory"
	"mesh-controller/contexts/licences"
	"mesh-controller/contexts/secrets"
)

// Pushed is what became of one node's declaration.
type Pushed struct {
	Node   string `json:"node"`
	Serial int64  `json:"serial"`
	Sent   bool   `json:"sent"`
	// NotSent says why it was kept but not sent now (it goes when serve runs).
	NotSent string `json:"not_sent,omitempty"`
	// Problem says why no declaration was made: the plan cannot stand.
	Problem string `json:"problem,omitempty"`
	// Declared says another act had declared this plan already (a declarer
	// asked for nodes still behind only): Serial is that act's.
	Declared bool `json:"already_declared,omitempty"`
	// NotJoined says the node's host has not joined yet: what is sent waits
	// for it, and is delivered when it joins (it asks for its latest).
	NotJoined bool `json:"not_joined,omitempty"`
}

// declarer makes declarations from plans and sends them.
type declarer struct {
	inv *inventory.Store
	sec *secrets.Store
	lic *licences.Store
	ids *identity.Store
	key identity.SigningKey
	// nc publishes; nil when no broker was reached, notSent says why.
	nc      *nats.Conn
	notSent string
	now     func() time.Time
	// progress, if set, is told how many nodes were planned and sent.
	progress func(stage string, done, total int)
	// hs, if set, keeps how long the last declare's parts took (durations
	// of kind "declare"); took says it too.
	hs   *health.Store
	took DeclareTimes
	// ifBehind declares only nodes whose latest declaration is still
	// behind the plan read (the catch-up, beside acts that declare).
	ifBehind bool
	// dialled, if set, is closed once declareVia's dial ended (nc or
	// notSent set): sending waits for it, planning and signing do not.
	dialled chan struct{}
}

// DeclareTimes is how long declaring to many nodes took, part by part:
// computing their plans, signing, keeping them (one transaction), and
// publishing them.
type DeclareTimes struct {
	Nodes                   int
	Plan, Sign, Store, Send time.Duration
}

// planInputs are what every plan needs beside the snapshot: the sealed
// secrets, the modules' credentials, the licences held and managed, the
// SSH port each node reported (for its filter), and the hosts' recipients.
type planInputs struct {
	sealed        map[string]plan.Sealed
	creds         map[string]string
	held, managed map[string][]plan.Sealed
	ssh           map[string]int
	recipients    map[string]string
	err           error
}

// readInputs reads the planner's inputs at once, each from its store: at
// ten thousand nodes each is as many rows, and a change to every node
// waits for them all.
func (d *declarer) readInputs(ctx context.Context) planInputs {
	var in planInputs
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() (err error) { in.sealed, err = sealedCopies(gctx, d.sec); return err })
	g.Go(func() (err error) { in.creds, err = moduleCreds(gctx, d.ids); return err })
	g.Go(func() (err error) { in.held, in.managed, err = heldLicences(gctx, d.lic); return err })
	g.Go(func() (err error) { in.ssh, err = sshPorts(gctx, d.inv); return err })
	g.Go(func() (err error) { in.recipients, err = hostRecipients(gctx, d.ids); return err })
	in.err = g.Wait()
	return in
}

// planner is the planner of snap with its inputs.
func (d *declarer) planner(ctx context.Context, snap *inventory.Snapshot) (*plan.Planner, error) {
	in := d.readInputs(ctx)
	if in.err != nil {
		return nil, in.err
	}
	return plan.New(snap, in.sealed).WithCreds(in.creds).WithLicences(in.held).WithManaged(in.managed).WithFilter(filterRender(in.ssh)).WithRecipients(in.recipients), nil
}

// declare computes, signs and keeps each node's plan as its next
// declaration, and publishes it if it can.
func (d *declarer) declare(ctx context.Context, snap *inventory.Snapshot, nodes []string) []Pushed {
	out := make([]Pushed, 0, len(nodes))
	// What every plan needs, read first: without it none is declared.
	failAll := func(err error) []Pushed {
		for _, n := range nodes {
			out = append(out, Pushed{Node: n, Problem: err.Error()})
		}
		return out
	}
	pl, err := d.planner(ctx, snap)
	if err != nil {
		return failAll(err)
	}
	// Plans first; then every declaration numbered, signed and kept in one
	// transaction; then sent.
	var reqs []inventory.DeclarationRequest
	var at []int
	tell := d.progress
	if tell == nil {
		tell = func(string, int, int) {}
	}
	planStart := time.Now()
	for i, node := range nodes {
		tell("planned", i, len(nodes))
		p := Pushed{Node: node}
		if n, ok := snap.Nodes[node]; ok && !n.Joined {
			p.NotJoined = true
		}
		np, err := pl.Plan(node)
		switch {
		case err != nil:
			p.Problem = err.Error()
		case len(np.Problems) > 0:
			p.Problem = "its plan cannot be declared: " + strings.Join(np.Problems, "; ")
		}
		out = append(out, p)
		if p.Problem != "" {
			continue
		}
		body := np.Body
		reqs = append(reqs, inventory.DeclarationRequest{Node: node, PlanVersion: np.PlanVersion, Sign: d.signer(body), IfBehind: d.ifBehind})
		at = append(at, len(out)-1)
	}
	d.took = DeclareTimes{Nodes: len(reqs), Plan: time.Since(planStart)}
	decls, saved, err := d.inv.SaveDeclarationsTimed(ctx, reqs, d.now())
	d.took.Sign, d.took.Store = saved.Sign, saved.Store
	if err != nil {
		for _, i := range at {
			out[i].Problem = err.Error()
		}
		return out
	}
	tell("signed and kept", len(decls), len(decls))
	if d.dialled != nil {
		<-d.dialled
	}
	sendStart := time.Now()
	defer func() { d.took.Send = time.Since(sendStart); d.keepTimes(ctx) }()
	for k, decl := range decls {
		tell("sent", k, len(decls))
		p := &out[at[k]]
		p.Serial = decl.Serial
		if decl.Declared {
			p.Declared = true
			continue
		}
		if d.nc == nil {
			p.NotSent = d.notSent
		} else if err := daemon.PublishDeclaration(d.nc, decl); err != nil {
			p.NotSent = err.Error()
		} else {
			p.Sent = true
		}
	}
	if d.nc != nil {
		if err := d.nc.FlushTimeout(protocol.AnswerTimeout); err != nil {
			for i := range out {
				if out[i].Sent {
					out[i].Sent, out[i].NotSent = false, err.Error()
				}
			}
		}
	}
	return out
}

// keepTimes keeps how long the parts of a declare to many nodes took, as
// durations of kind "declare" ('durations --kind declare'): a declare to
// fewer than 100 nodes is a person's act on a few, not worth a row.
func (d *declarer) keepTimes(ctx context.Context) {
	if d.hs == nil || d.took.Nodes < 100 {
		return
	}
	now, t := d.now(), d.took
	var ds []health.Duration
	for _, part := range []struct {
		name string
		took time.Duration
	}{{"plan", t.Plan}, {"sign", t.Sign}, {"store", t.Store}, {"send", t.Send}} {
		ds = append(ds, health.Duration{Kind: "declare", Subject: part.name, MS: float64(part.took.Microseconds()) / 1000, At: now})
	}
	_ = d.hs.RecordDurations(ctx, ds) // a measurement lost fails no declaration
}

// signer numbers and signs a declaration once the store gives it its serial.
func (d *declarer) signer(body protocol.Declaration) inventory.Signer {
	return func(serial int64, issuedAt time.Time) (string, string, string, error) {
		body.Serial, body.IssuedAt = serial, issuedAt.UTC()
		env, err := protocol.Seal(body, d.key.Sign, d.key.Fingerprint())
		return env.Declaration, env.Signature, env.Key, err
	}
}

// sealedCopies reads every secret's sealed copy, keyed node/module/name.
func sealedCopies(ctx context.Context, sec *secrets.Store) (map[string]plan.Sealed, error) {
	copies, err := sec.Copies(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]plan.Sealed, len(copies))
	for _, c := range copies {
		out[c.Node+"/"+c.Module+"/"+c.Name] = plan.Sealed{Name: c.Name, Version: c.Version, Sealed: c.Sealed}
	}
	return out, nil
}

// heldLicences reads the copy of each licence each module holds (its
// current version), and of each refresh token each manager holds, keyed
// node/module.
func heldLicences(ctx context.Context, lic *licences.Store) (held, managed map[string][]plan.Sealed, err error) {
	h, err := lic.Held(ctx)
	if err != nil {
		return nil, nil, err
	}
	m, err := lic.Managed(ctx)
	if err != nil {
		return nil, nil, err
	}
	return toSealed(h), toSealed(m), nil
}

func toSealed(copies map[string][]licences.Copy) map[string][]plan.Sealed {
	out := make(map[string][]plan.Sealed, len(copies))
	for k, cs := range copies {
		for _, c := range cs {
			out[k] = append(out[k], plan.Sealed{Name: c.Licence, Version: c.Version, Sealed: c.Sealed})
		}
	}
	return out
}

// sendPlans declares the plans of nodes from a person's command, on the
// mesh as it is once the command's writes are done: it rereads the
// snapshot, then declares. A declaration records the plan version it was
// made from.
func (c uses) sendPlans(ctx context.Context, st *Stores, nodes []string) ([]Pushed, error) {
	if len(nodes) == 0 {
		return nil, nil
	}
	snap, err := st.Inventory.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	d, err := c.newDeclarer(ctx, st)
	if err != nil {
		return nil, err
	}
	return d.declareVia(ctx, c, st, snap, nodes), nil
}

// declareVia declares over a connection of its own to the broker, dialled
// once for every node while the plans are made, signed and kept (none
// answering: kept for serve, and said).
func (d *declarer) declareVia(ctx context.Context, c uses, st *Stores, snap *inventory.Snapshot, nodes []string) []Pushed {
	d.dialled = make(chan struct{})
	go func() {
		defer close(d.dialled)
		if nc, err := c.dialBroker(ctx, st.Identity); err != nil {
			d.notSent = err.Error()
		} else {
			d.nc = nc
		}
	}()
	defer func() {
		<-d.dialled
		if d.nc != nil {
			d.nc.Close()
		}
	}()
	return d.declare(ctx, snap, nodes)
}

// newDeclarer reads the signing key once for every declaration it makes;
// the caller gives it a connection, or says in notSent why there is none.
func (c uses) newDeclarer(ctx context.Context, st *Stores) (*declarer, error) {
	key, err := st.Identity.SigningKey(ctx)
	if err != nil {
		return nil, err
	}
	return &declarer{inv: st.Inventory, sec: st.Secrets, lic: st.Licences, ids: st.Identity, hs: st.Health, key: key, now: c.Now}, nil
}

// PushRequest asks for declarations to be sent.
type PushRequest struct {
	// Node is one node; "" is every node.
	Node string
	// Behind sends only nodes whose declaration is behind their plan, or
	// whose host has not applied its latest.
	Behind bool
	// Why, if given, records the push as a hand act.
	Why string
	// Progress, if set, is told how far the declarations are.
	Progress func(stage string, done, total int)
}

// Push signs and sends nodes their declarations built from their plans.
func (c *Modules) Push(ctx context.Context, r PushRequest) ([]Pushed, error) {
	recorded := false // the hand act, once whatever the tries
	return retryAct(ctx, func() ([]Pushed, error) { return c.push(ctx, r, &recorded) })
}

func (c uses) push(ctx context.Context, r PushRequest, recorded *bool) ([]Pushed, error) {
	if r.Node != "" {
		if err := CheckName(r.Node); err != nil {
			return nil, err
		}
	}
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return nil, err
	}
	inv := st.Inventory
	var nodes []string
	for _, name := range snap.NodeNames {
		if (r.Node == "" || r.Node == name) && (!r.Behind || snap.Nodes[name].Behind()) {
			nodes = append(nodes, name)
		}
	}
	if r.Node != "" {
		if _, ok := snap.Nodes[r.Node]; !ok {
			return nil, fmt.Errorf("node %s %w", r.Node, inventory.ErrNodeNotFound)
		}
	}
	if r.Why != "" && !*recorded {
		what := "push every node"
		if r.Node != "" {
			what = "push " + r.Node
		}
		if r.Behind {
			what += " (behind only)"
		}
		if _, err := st.Health.RecordHandAct(ctx, health.HandAct{At: c.Now(), What: what, Why: r.Why, Cause: "push", Who: who()}); err != nil {
			return nil, err
		}
		*recorded = true
	}
	if r.Behind {
		// Versions recorded by 'upgrade record' are sent now: moved, with
		// the plans of their nodes, in one transaction.
		ch := inventory.Change{Based: snap.Revision}
		for _, a := range snap.Assignments {
			if a.Pending != "" && slices.Contains(nodes, a.Node) {
				ch.Versions = append(ch.Versions, inventory.Assignment{Node: a.Node, Module: a.Module, Version: a.Pending})
				ch.Bump = append(ch.Bump, a.Node)
			}
		}
		if len(ch.Versions) > 0 {
			if err := inv.Apply(ctx, ch, c.Now()); err != nil {
				return nil, err
			}
			// Their plans moved: declarations are made from the mesh as written.
			if snap, err = inv.Snapshot(ctx); err != nil {
				return nil, err
			}
		}
	}
	if len(nodes) == 0 {
		return nil, nil
	}
	d, err := c.newDeclarer(ctx, st)
	if err != nil {
		return nil, err
	}
	d.progress = r.Progress
	return d.declareVia(ctx, c, st, snap, nodes), nil
}

// PlanView is one node's plan as plan shows it.
type PlanView struct {
	Plan plan.Plan
	// JSON is the declaration body with a reasons map, canonical.
	JSON []byte
	// Files are what a host would write beneath its root.
	Files []string
	// States are its modules' states as its host last reported them.
	States map[string]health.ModuleState
	// Routed are its public ports and the names they are routed under.
	Routed []plan.Routed
}

// PlanShown is the plan as plan --json prints it (PlanView.JSON) and
// GET /v1/plan/{node} answers it: the declaration its node is sent, with
// the reasons for each module and what keeps it from being sent.
type PlanShown struct {
	protocol.Declaration
	// Reasons are why each module is there, by module.
	Reasons map[string][]string `json:"reasons"`
	// Problems are what keeps the plan from being declared.
	Problems []string `json:"problems,omitempty"`
}

// PlanShow computes one node's plan.
func (c *Modules) PlanShow(ctx context.Context, node string) (PlanView, error) {
	if err := CheckName(node); err != nil {
		return PlanView{}, err
	}
	st, snap, err := c.storesAndSnapshot(ctx)
	if err != nil {
		return PlanView{}, err
	}
	pl, err := (&declarer{inv: st.Inventory, sec: st.Secrets, lic: st.Licences, ids: st.Identity}).planner(ctx, snap)
	if err != nil {
		return PlanView{}, err
	}
	p, err := pl.Plan(node)
	if err != nil {
		return PlanView{}, err
	}
	js, err := protocol.Canonical(PlanShown{p.Body, p.Reasons, p.Problems})
	if err != nil {
		return PlanView{}, err
	}
	reported, err := st.Health.ModuleStates(ctx, node)
	if err != nil {
		return PlanView{}, err
	}
	states := map[string]health.ModuleState{}
	for _, m := range reported {
		states[m.Module] = m
	}
	return PlanView{Plan: p, JSON: js, Files: hostFiles(p.Body), States: states, Routed: plan.RoutedNames(p.Body)}, nil
}

// hostFiles lists what a host writes beneath its root for a plan: each
// module's files, and its data directories (never removed).
func hostFiles(d protocol.Declaration) []string {
	var files []string
	for _, m := range d.Modules {
		files = append(files, protocol.Files(m)...)
		for _, ds := range m.Data {
			files = append(files, strings.TrimPrefix(ds.Path, "/")+"/ (data: "+ds.Precious+", never removed by the host)")
		}
	}
	return files
}
