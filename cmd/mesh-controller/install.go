package main

import (
	"mesh-controller/app/service"
	"mesh-controller/cmd/clirun"
)

// InstallCmd is install.
type InstallCmd struct {
	Bin string `type:"path" placeholder:"PATH" help:"The binary the unit runs (default: this executable, its links followed; /usr/bin/mesh-controller when installed from the .deb)."`
	clirun.ServiceFlags
}

// Run installs the unit.
func (c *InstallCmd) Run(env *Env) error {
	bin, err := clirun.ServiceBin(c.Bin)
	if err != nil {
		return err
	}
	return service.Install(c.Options(service.Controller, bin, env.Stdout, env.Stderr))
}

// UninstallCmd is uninstall.
type UninstallCmd struct {
	clirun.ServiceFlags
}

// Run removes the unit, keeping the data.
func (c *UninstallCmd) Run(env *Env) error {
	return service.Uninstall(c.Options(service.Controller, "", env.Stdout, env.Stderr))
}
