package protocol

import (
	"path"
	"slices"
	"strings"
)

// ModulesDir is where, beneath a host's root, each module's part of its
// declaration is written. It is part of the protocol, not of the reference
// host alone: the controller's plan --files shows the same layout.
const ModulesDir = "etc/mesh/modules"

// Files lists, for one declared module, the files a host writes beneath its
// root (relative, slash-separated): its part of the declaration, its
// settings when it has any, and its secrets and credentials.
func Files(m DeclaredModule) []string {
	module, settings := DocumentFiles(m)
	files := []string{module}
	if settings != "" {
		files = append(files, settings)
	}
	files = append(files, path.Join(ModulesDir, m.Module, BindingsFile))
	if slices.Contains(m.Seats, "backup") {
		files = append(files, path.Join(ModulesDir, m.Module, BackupLinesName))
	}
	for _, sf := range SealedFiles("", m) {
		files = append(files, sf.Rel)
	}
	return files
}

// DocumentFiles names the files of a declared module written from the
// declaration itself: module.json, its part, and settings.json, its
// settings, or "" when it has none.
func DocumentFiles(m DeclaredModule) (module, settings string) {
	dir := path.Join(ModulesDir, m.Module)
	if len(m.Settings) > 0 && string(m.Settings) != "null" {
		settings = path.Join(dir, "settings.json")
	}
	return path.Join(dir, "module.json"), settings
}

// BindingsFile is, in a module's directory, the file its host writes of
// where it finds each provision it is bound to (MESH_BINDINGS): the
// provider, its address and the credential file's path on that host.
const BindingsFile = "bindings.json"

// BrokerCredsName names a module's own broker user: the name in its
// sealed label, and its file (0600) in the module's directory.
const BrokerCredsName = "broker.creds"

// SealedFile is a file of a module holding a value opened from a sealed
// copy, and the label the copy must carry.
type SealedFile struct {
	Rel    string
	Sealed string
	Label  Label
}

// SealedFiles lists the secrets and credentials a declared module carries,
// for node.
func SealedFiles(node string, m DeclaredModule) []SealedFile {
	dir := path.Join(ModulesDir, m.Module)
	var out []SealedFile
	if m.BrokerCreds != "" {
		// Its label's version is when it was made: any is taken (0).
		out = append(out, SealedFile{path.Join(dir, BrokerCredsName), m.BrokerCreds, Label{Node: node, Module: m.Module, Name: BrokerCredsName}})
	}
	for _, s := range m.Secrets {
		out = append(out, SealedFile{path.Join(dir, "secrets", s.Name), s.Sealed, Label{Node: node, Module: m.Module, Name: s.Name, Version: s.Version}})
	}
	for _, l := range m.Licences {
		out = append(out, SealedFile{LicenceFile(m.Module, l.Name), l.Sealed, LicenceLabel(node, m.Module, l.Name, l.Version)})
	}
	for _, l := range m.Manages {
		out = append(out, SealedFile{RefreshFile(m.Module, l.Name), l.Sealed, RefreshLabel(node, m.Module, l.Name, l.Version)})
	}
	for _, b := range m.Bindings {
		if b.Credential == "" {
			continue
		}
		pn, pm, _ := strings.Cut(b.From, "/")
		out = append(out, SealedFile{path.Join(dir, "bindings", b.Provision+".credential"), b.Credential,
			Label{Node: pn, Module: pm, Name: b.CredentialName, Version: b.CredentialVersion}})
	}
	for _, c := range m.Consumers {
		if c.Credential == "" || c.State == "retired" {
			continue
		}
		out = append(out, SealedFile{path.Join(dir, "consumers", strings.ReplaceAll(c.Consumer, "/", "_"), c.Provision+".credential"), c.Credential,
			Label{Node: node, Module: m.Module, Name: c.CredentialName, Version: c.CredentialVersion}})
	}
	return out
}

// LicenceFile is where, beneath a host's root, a module's copy of a licence
// is written: beside its secrets, in its own directory.
func LicenceFile(module, licence string) string {
	return path.Join(ModulesDir, module, "licences", licence)
}

// LicenceEnv is the environment variable that names a held licence's file:
// MESH_LICENCE_ and its name in upper case, '-' as '_'.
func LicenceEnv(licence string) string {
	return "MESH_LICENCE_" + strings.ToUpper(strings.ReplaceAll(licence, "-", "_"))
}

// LicenceLabel labels a holder's copy of a licence. A licence's name is a
// name (no '/'), so "licence/NAME" is never a secret's or credential's name.
func LicenceLabel(node, module, licence string, version int64) Label {
	return Label{Node: node, Module: module, Name: "licence/" + licence, Version: version}
}

// OperatorLicenceLabel labels a licence's copy sealed to the operator key
// alone; kind is "operator" (its token) or "refresh" (its refresh token).
// '*' is never a node's or module's name.
func OperatorLicenceLabel(licence, kind string, version int64) Label {
	return Label{Node: "*", Module: "*", Name: kind + "/" + licence, Version: version}
}

// RefreshFile is where, beneath a host's root, a managing module's copy of
// a licence's refresh token is written: beside the licence's own file, as
// NAME.refresh (a licence's name has no '.').
func RefreshFile(module, licence string) string {
	return path.Join(ModulesDir, module, "licences", licence+".refresh")
}

// RefreshEnv is the environment variable that names a managed licence's
// refresh token file: MESH_REFRESH_ and its name in upper case, '-' as
// '_'. A family of its own: MESH_LICENCE_<NAME>_REFRESH could be another
// licence's (NAME-refresh) variable.
func RefreshEnv(licence string) string {
	return "MESH_REFRESH_" + strings.ToUpper(strings.ReplaceAll(licence, "-", "_"))
}

// RefreshLabel labels a manager's copy of a licence's refresh token.
func RefreshLabel(node, module, licence string, version int64) Label {
	return Label{Node: node, Module: module, Name: "licence-refresh/" + licence, Version: version}
}
