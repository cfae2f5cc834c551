package inventory

import (
	"encoding/json"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"mesh-controller/contexts/inventory/manifest"
)

// A module's manifest is the inventory's model without its store: package
// manifest holds it, so that a builder or a host reads one without linking
// a database driver. These names keep the inventory's callers as they were;
// a package that must not link the store imports manifest itself.

type (
	// Manifest is a module's description (manifest.Manifest).
	Manifest = manifest.Manifest
	// Problem is one thing wrong with a manifest (manifest.Problem).
	Problem = manifest.Problem
	// Build says how a builder turns a module's source into an archive (manifest.Build).
	Build = manifest.Build
	// Prepare is how a version brings its module's data to its shape (manifest.Prepare).
	Prepare = manifest.Prepare
	// Provision is something a module provides to others (manifest.Provision).
	Provision = manifest.Provision
	// Seat is a role a module can fill (manifest.Seat).
	Seat = manifest.Seat
	// Secret is a secret a module uses, and who makes it (manifest.Secret).
	Secret = manifest.Secret
	// LicenceNeed is a licence a module needs (manifest.LicenceNeed).
	LicenceNeed = manifest.LicenceNeed
	// DataSpec is one place a module keeps state (manifest.DataSpec).
	DataSpec = manifest.DataSpec
	// DataBackup is a data set's backup, as its manifest says it (manifest.DataBackup).
	DataBackup = manifest.DataBackup
	// Tool is something a module answers on mesh.tool.M.T (manifest.Tool).
	Tool = manifest.Tool
)

// Preciousness levels (manifest's).
const (
	Irreplaceable = manifest.Irreplaceable
	Costly        = manifest.Costly
	Rebuildable   = manifest.Rebuildable
)

// DefaultBuildTimeout is how long a build may run unless its manifest says
// (manifest.DefaultBuildTimeout).
const DefaultBuildTimeout = manifest.DefaultBuildTimeout

// GitCredentialsSecret is the builder's secret for private repositories
// (manifest.GitCredentialsSecret).
const GitCredentialsSecret = manifest.GitCredentialsSecret

// RepositoryCredentialHint says what to do instead of a credential in a
// repository URL (manifest.RepositoryCredentialHint).
const RepositoryCredentialHint = manifest.RepositoryCredentialHint

// ErrRepositoryCredential means a repository URL carries a credential
// (manifest.ErrRepositoryCredential).
var ErrRepositoryCredential = manifest.ErrRepositoryCredential

// ParseManifest reads a manifest strictly and judges it (manifest.Parse).
func ParseManifest(data []byte) (Manifest, []Problem) { return manifest.Parse(data) }

// CheckRepository refuses a repository URL that carries a credential
// (manifest.CheckRepository).
func CheckRepository(repository string) error { return manifest.CheckRepository(repository) }

// RedactRepository is a repository URL with any credential hidden
// (manifest.RedactRepository).
func RedactRepository(repository string) string { return manifest.RedactRepository(repository) }

// RedactText hides credentials in repository URLs within a text
// (manifest.RedactText).
func RedactText(s string) string { return manifest.RedactText(s) }

// ValidName says whether s is a valid name (manifest.ValidName).
func ValidName(s string) bool { return manifest.ValidName(s) }

// Validate judges a settings document against a compiled schema
// (manifest.Validate).
func Validate(sch *jsonschema.Schema, doc json.RawMessage) []Problem {
	return manifest.Validate(sch, doc)
}
