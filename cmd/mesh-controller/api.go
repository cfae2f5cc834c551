package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"mesh-controller/app"
	"mesh-controller/app/logger"
	"mesh-controller/cmd/clirun"
)

// APICmd is api.
type APICmd struct {
	Issuer      string `required:"" placeholder:"URL" help:"The OpenID Connect issuer whose signed bearer tokens are accepted (its discovery document and keys are read from it)."`
	Listen      string `default:"127.0.0.1:8470" placeholder:"ADDR" help:"Where the API is served; an address not on loopback needs --tls-cert and --tls-key."`
	Audience    string `default:"mesh-controller" help:"The audience (aud) a token must name."`
	GroupsClaim string `default:"groups" placeholder:"CLAIM" help:"The token claim that lists the caller's groups."`
	AdminGroup  string `default:"mesh-admin" placeholder:"GROUP" help:"The group that may assign, unassign and read."`
	ReadGroup   string `default:"mesh-read" placeholder:"GROUP" help:"The group that may read."`
	TLSCert     string `name:"tls-cert" type:"existingfile" placeholder:"FILE" help:"A PEM certificate (chain) to serve HTTPS with."`
	TLSKey      string `name:"tls-key" type:"existingfile" placeholder:"FILE" help:"Its PEM private key."`
	LogFormat   string `name:"log-format" enum:"text,json" default:"text" help:"How the log on stderr is written: text (key=value) or json (one object a line). Each request is a line: method, path, status, duration and who (never a token or a header)."`
	LogLevel    string `name:"log-level" enum:"debug,info,warn,error" default:"info" help:"The least a line of the log must matter to be written: debug also logs the probes (/healthz, /readyz)."`
}

// Run serves the API until SIGINT or SIGTERM.
func (c *APICmd) Run(env *Env, api app.API) error {
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return clirun.UsageError{Msg: "give --tls-cert and --tls-key together"}
	}
	var tlsConf *tls.Config
	if c.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
		if err != nil {
			return fmt.Errorf("read --tls-cert and --tls-key: %w", err)
		}
		tlsConf = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	} else if !loopback(c.Listen) {
		return fmt.Errorf("refusing to serve the API on %s in plain HTTP: bearer tokens would cross the network readable; give --tls-cert and --tls-key, or listen on 127.0.0.1", c.Listen)
	}
	log, err := logger.New(env.Stderr, c.LogFormat, c.LogLevel)
	if err != nil {
		return err
	}
	// One client for discovery and every later key fetch, so that an
	// issuer that stops answering costs a bounded wait, not a hung request.
	v, err := app.NewTokenVerifier(env.Ctx, c.Issuer, c.Audience, app.TokenVerifierOptions{Client: &http.Client{Timeout: 10 * time.Second}})
	if err != nil {
		return fmt.Errorf("issuer %s: %w; check --issuer names an OpenID Connect issuer this machine can reach", c.Issuer, err)
	}
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return err
	}
	srv := app.APIServer(api.APIHandler(v, app.APIAccess{GroupsClaim: c.GroupsClaim, AdminGroup: c.AdminGroup, ReadGroup: c.ReadGroup}, log))
	srv.TLSConfig = tlsConf
	scheme := "http"
	if tlsConf != nil {
		scheme = "https"
	}
	fmt.Fprintf(env.Stdout, "api: %s://%s (issuer %s)\n", scheme, ln.Addr(), c.Issuer)
	go func() {
		<-env.Ctx.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}()
	if tlsConf != nil {
		err = srv.ServeTLS(ln, "", "")
	} else {
		err = srv.Serve(ln)
	}
	if !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// loopback says whether addr (host:port) is served only on this machine.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
