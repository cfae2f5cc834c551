package app

import (
	"context"
	"slices"

	"mesh-controller/contexts/inventory"
	"mesh-controller/embedded/sqlite"
)

// uses is what every service is made of: the process's settings (data dir,
// clock, broker) and a view of the stores holding only those the service
// names. A store it does not name is nil in its view, so a use case that
// reached for one would fail at its first test, never quietly work on it.
type uses struct {
	*Controller
	st *Stores
}

// stores is the service's view once every store it names has opened: a
// command never works on part of the mesh.
func (u uses) stores(context.Context) (*Stores, error) {
	for _, name := range u.st.named {
		if err := u.st.failed[name]; err != nil {
			return nil, err
		}
	}
	return u.st, nil
}

// storesAndSnapshot is the view and the mesh as it stood when the command
// began: what nearly every command starts from.
func (u uses) storesAndSnapshot(ctx context.Context) (*Stores, *inventory.Snapshot, error) {
	st, err := u.stores(ctx)
	if err != nil {
		return nil, nil, err
	}
	snap, err := st.Inventory.Snapshot(ctx)
	if err != nil {
		return nil, nil, err
	}
	return st, snap, nil
}

// checkStores is the view as the self-check judges it: every store that
// opened, each failure kept for its probe.
func (u uses) checkStores(context.Context) (*Stores, func()) { return u.st, func() {} }

// view is the service made on the stores named, out of the process's.
func view(c *Controller, all *Stores, names ...string) uses {
	v := &Stores{dbs: map[string]*sqlite.DB{}, failed: map[string]error{}, named: names}
	for _, name := range names {
		if !slices.Contains(Contexts, name) {
			panic("no context " + name)
		}
		if db := all.dbs[name]; db != nil {
			v.dbs[name] = db
		}
		if err := all.failed[name]; err != nil {
			v.failed[name] = err
		}
		switch name {
		case "inventory":
			v.Inventory = all.Inventory
		case "identity":
			v.Identity = all.Identity
		case "secrets":
			v.Secrets = all.Secrets
		case "licences":
			v.Licences = all.Licences
		case "health":
			v.Health = all.Health
		case "builds":
			v.Builds = all.Builds
		}
	}
	return uses{Controller: c, st: v}
}

// serviceStores are the stores each service names: all its use cases
// reach (TestServicesReachOnlyTheStoresTheyName reads every function they
// call). A declaration is made of the inventory, the node's identity, its
// secrets and licences, and the hand act recorded in health: every service
// that declares names those five; only those that ask or read builds name
// the builds store.
var serviceStores = map[string][]string{
	"Nodes":    {"inventory", "identity", "secrets", "licences", "health"},
	"Modules":  {"inventory", "identity", "secrets", "licences", "builds", "health"},
	"Seats":    {"inventory", "identity", "secrets", "licences", "health"},
	"Secrets":  {"inventory", "identity", "secrets", "licences", "health"},
	"Licences": {"inventory", "identity", "secrets", "licences", "health"},
	"Builds":   {"inventory", "identity", "builds", "health"},
	"Health":   Contexts,
	"Copies":   Contexts,
	"Server":   Contexts,
}

// Nodes are the use cases of machines: adding and removing them, their
// tokens and keys, their routing and overlay, adopting and taking over.
type Nodes struct{ uses }

// Modules are the use cases of modules and where they run: registering,
// assigning, upgrading, converging, declaring, asking and logs.
type Modules struct{ uses }

// Seats are the use cases of seats, provisions, retirement, cleanup and
// the data each machine keeps, with its backups.
type Seats struct{ uses }

// Secrets are the use cases of the operator key and the secrets sealed to it.
type Secrets struct{ uses }

// Licences are the use cases of licences and their refreshes.
type Licences struct{ uses }

// Builds are the use cases of the build queue, builders and build plans.
type Builds struct{ uses }

// Health are the use cases of what is wrong: status, conditions, the
// self-check, healers, hand acts, durations and the board.
type Health struct{ uses }

// Copies are the use cases of the stores as a whole: a backup of them all,
// a copy onto another engine.
type Copies struct{ uses }

// Server is serve: the daemon on every store, with the other services'
// use cases it schedules.
type Server struct {
	uses
	// all are the process's stores, which serve may migrate
	// (migrateBehind) and make the server anew on.
	all      *Stores
	builds   *Builds
	seats    *Seats
	modules  *Modules
	health   *Health
	licences *Licences
}

// NewNodes is the nodes' service on the process's stores.
func NewNodes(c *Controller, all *Stores) *Nodes {
	return &Nodes{view(c, all, serviceStores["Nodes"]...)}
}

// NewModules is the modules' service on the process's stores.
func NewModules(c *Controller, all *Stores) *Modules {
	return &Modules{view(c, all, serviceStores["Modules"]...)}
}

// NewSeats is the seats' and data's service on the process's stores.
func NewSeats(c *Controller, all *Stores) *Seats {
	return &Seats{view(c, all, serviceStores["Seats"]...)}
}

// NewSecrets is the secrets' service on the process's stores.
func NewSecrets(c *Controller, all *Stores) *Secrets {
	return &Secrets{view(c, all, serviceStores["Secrets"]...)}
}

// NewLicences is the licences' service on the process's stores.
func NewLicences(c *Controller, all *Stores) *Licences {
	return &Licences{view(c, all, serviceStores["Licences"]...)}
}

// NewBuilds is the builds' service on the process's stores.
func NewBuilds(c *Controller, all *Stores) *Builds {
	return &Builds{view(c, all, serviceStores["Builds"]...)}
}

// NewHealth is the health service on the process's stores.
func NewHealth(c *Controller, all *Stores) *Health {
	return &Health{view(c, all, serviceStores["Health"]...)}
}

// NewCopies is the stores-as-a-whole service on the process's stores.
func NewCopies(c *Controller, all *Stores) *Copies {
	return &Copies{view(c, all, serviceStores["Copies"]...)}
}

// NewServer is serve's service on the process's stores.
func NewServer(c *Controller, all *Stores) *Server {
	return &Server{uses: view(c, all, serviceStores["Server"]...), all: all, builds: NewBuilds(c, all), seats: NewSeats(c, all),
		modules: NewModules(c, all), health: NewHealth(c, all), licences: NewLicences(c, all)}
}
