// Package app holds mesh-controller's use cases. Each composes the contexts it
// needs (no query joins two of them) and returns results for cmd/ to print.
package app

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"mesh-controller/app/metrics"
	"mesh-controller/app/protocol"
	"mesh-controller/app/service"
	"mesh-controller/embedded/sqlite"
)

// Contexts names every context, each with its own store, in the order they
// are migrated and listed.
var Contexts = []string{"inventory", "identity", "secrets", "licences", "builds", "health"}

// ErrInvalidName means a name is not [a-z][a-z0-9-]{0,62}.
var ErrInvalidName = errors.New("is not a valid name: use a lowercase letter, then up to 62 lowercase letters, digits or dashes")

// CheckName refuses a name (node, module, seat, provision, secret, licence)
// that is not [a-z][a-z0-9-]{0,62}, before any store is touched.
func CheckName(name string) error {
	if !protocol.ValidName(name) {
		return fmt.Errorf("%q %w", name, ErrInvalidName)
	}
	return nil
}

// ErrReservedName means a node name is one the mesh uses for itself.
var ErrReservedName = errors.New("is reserved: the mesh uses it for itself (reserved: alert, build, control, join, module, node, tool)")

// reservedNodeNames are the words the mesh itself puts right after mesh. in
// its subjects (mesh.join, mesh.node.…, mesh.control.…, mesh.tool.…,
// mesh.module.…, mesh.build.…, mesh.alert) and, for join, as an inbox
// prefix: a node's inbox is _INBOX.<node>, so a node named join would share
// the join inbox, and one named after another of them could be taken for it
// by whatever reads subjects and inboxes by their words.
var reservedNodeNames = map[string]bool{"alert": true, "build": true, "control": true, "join": true, "module": true, "node": true, "tool": true}

// CheckNodeName refuses a node name that is not a name (CheckName), or one
// the mesh uses for itself.
func CheckNodeName(name string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	if reservedNodeNames[name] {
		return fmt.Errorf("node name %q %w", name, ErrReservedName)
	}
	return nil
}

// CheckNames checks several names at once, refusing the first that is not valid.
func CheckNames(names ...string) error {
	for _, n := range names {
		if err := CheckName(n); err != nil {
			return err
		}
	}
	return nil
}

// DefaultDataDir is, for root (euid 0), /var/lib/mesh-controller, where
// the service keeps it (service.Controller.DataDir), so that a person's
// commands as root use the service's stores; for another user
// $XDG_DATA_HOME/mesh-controller, else ~/.local/share/mesh-controller.
func DefaultDataDir(getenv func(string) string, euid int) string {
	if euid == 0 {
		return service.Controller.DataDir()
	}
	if x := getenv("XDG_DATA_HOME"); x != "" {
		return filepath.Join(x, "mesh-controller")
	}
	home := getenv("HOME")
	if home == "" {
		home, _ = os.UserHomeDir()
	}
	return filepath.Join(home, ".local", "share", "mesh-controller")
}

// Controller is the application: where its stores are, and its clock.
type Controller struct {
	// DataDir holds every store not moved by its own variable.
	DataDir string
	// Getenv reads the environment (the stores' credentials).
	Getenv func(string) string
	// Now is the clock; tests set it.
	Now func() time.Time
	// Broker is an external NATS URL (--broker, MESH_BROKER); empty means the
	// serving controller's embedded broker.
	Broker string
	// Version is the binary's build version ("" for a development build):
	// recorded with the lease and by migrate, so that other controllers on
	// the same stores name it.
	Version string

	// metrics, set while serving with --metrics, are told how long the
	// catch-up's declares took.
	metrics *metrics.Metrics
}

// New makes a Controller on dataDir reading the process's environment.
func New(dataDir string) *Controller {
	return &Controller{DataDir: dataDir, Getenv: os.Getenv, Now: time.Now}
}

// StoreError is a failure to open or check one context's store; it carries
// the location so the message can say which variable to check.
type StoreError struct {
	Location sqlite.Location
	Err      error
}

func (e *StoreError) Error() string {
	return fmt.Sprintf("%s store %s: %v", e.Location.Context, e.Location.Shown(), e.Err)
}

// Unwrap returns the cause.
func (e *StoreError) Unwrap() error { return e.Err }

// StoreLocations resolves every context's store location.
func (c *Controller) StoreLocations() ([]sqlite.Location, error) {
	locs := make([]sqlite.Location, 0, len(Contexts))
	for _, name := range Contexts {
		loc, err := sqlite.Locate(name, c.DataDir, c.Getenv)
		if err != nil {
			return nil, &StoreError{Location: loc, Err: err}
		}
		locs = append(locs, loc)
	}
	return locs, nil
}
