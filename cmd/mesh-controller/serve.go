package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"mesh-controller/app"
	"mesh-controller/app/alerthook"
	"mesh-controller/app/service"
	"mesh-controller/cmd/clirun"
	"mesh-controller/contexts/identity"
)

// ServeCmd is serve.
type ServeCmd struct {
	Listen              string        `default:"${listen}" placeholder:"ADDR" help:"Where the embedded broker listens (port 0 picks a free one)."`
	CheckEvery          time.Duration `default:"30s" help:"How often the self-check runs (it also runs after events that matter)."`
	Lease               time.Duration `default:"10s" help:"How long the lease lasts unrenewed (renewed every third of it): a controller standing by takes over within it of this one's death."`
	CatchUpEvery        time.Duration `default:"5s" help:"How often nodes behind their plan are declared, and what an act stopped half-way left undone is done."`
	BoundsFromDurations bool          `help:"Set each node's silence bound from its measured heartbeat intervals (3 x p99), never below the default."`
	MemoryLimitMiB      int64         `name:"memory-limit" default:"700" placeholder:"MiB" help:"The runtime's soft memory limit in MiB (0: none; GOMEMLIMIT wins). Below what the mesh keeps, the collector never stops: 10,000 hosts keep about 500 MiB, and took 150 % of a core under 400 MiB, 25 % under 700."`
	BackupEvery         time.Duration `placeholder:"D" help:"Back every store up this often (1s or more), sealed to the operator key, into --backup-dir."`
	BackupDir           string        `placeholder:"DIR" help:"Where --backup-every keeps its backups (made 0700), named mesh-backup-<UTC time>.age."`
	BackupKeep          int           `default:"7" placeholder:"N" help:"How many of its backups --backup-every keeps; it deletes only older ones of its own naming."`
	CPUProfile          string        `name:"cpu-profile" placeholder:"FILE" help:"Write a CPU profile of the daemon to FILE until it stops (go tool pprof reads it), to measure where its time goes; each SIGUSR2 closes it and begins the next in FILE.1, FILE.2, …"`
	Metrics             string        `placeholder:"ADDR" help:"Answer /metrics in the Prometheus text format at ADDR (host:port), a loopback address unless --metrics-public; /healthz (alive) and /readyz (serving, its stores answering; 503 and why while it starts, stands by or stands aside) beside it."`
	MetricsPublic       bool          `help:"Let --metrics listen on an address other machines can reach: the metrics say how many nodes there are, their states and the stores' sizes."`
	AlertWebhook        string        `placeholder:"URL" help:"Post each alert raised or cleared (what mesh.alert carries) as JSON to URL (http or https), retried with back-off; never holding the daemon up (a full queue drops, and says so in the log). Its userinfo and query values are never logged."`
	LogFormat           string        `name:"log-format" enum:"text,json" default:"text" help:"How the daemon's log on stderr is written: text (key=value) or json (one object a line); each line carries its subject (node, module, condition) as attributes. The ready line stays plain on stdout."`
	LogLevel            string        `name:"log-level" enum:"debug,info,warn,error" default:"info" help:"The least a line of the log must matter to be written: debug also says what the hot paths do (each heartbeat absorbed, each declaration asked for)."`
	HostCredentials     time.Duration `name:"host-credentials-ttl" default:"720h" placeholder:"D" help:"How long a host's broker user lasts: given at join and renewed by its host when a third of it is left (token-free: a request signed by its host key, for a new nkey), so a credential copied off a host's disk stops working on its own. A host away past it renews through the join path when it is back."`
	HeapProfile         string        `name:"heap-profile" placeholder:"FILE" help:"On each SIGUSR1, write a heap profile of the daemon to FILE (replacing it; go tool pprof reads it) and log what its memory is made of, to measure what it keeps."`
}

// Run serves until SIGINT or SIGTERM, then gives the lease back.
func (c *ServeCmd) Run(env *Env, srv *app.Server) error {
	stopProfile, err := clirun.CPUProfile(c.CPUProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	if c.HeapProfile != "" {
		usr1 := make(chan os.Signal, 1)
		signal.Notify(usr1, syscall.SIGUSR1)
		defer signal.Stop(usr1)
		go func() {
			for range usr1 {
				if err := writeHeapProfile(c.HeapProfile, env.Stderr); err != nil {
					fmt.Fprintf(env.Stderr, "heap profile: %v\n", err)
				}
			}
		}()
	}
	switch {
	case c.BackupEvery == 0 && c.BackupDir != "":
		return clirun.UsageError{Msg: "--backup-dir goes with --backup-every"}
	case c.BackupEvery != 0 && c.BackupDir == "":
		return clirun.UsageError{Msg: "--backup-every needs --backup-dir"}
	case c.BackupEvery != 0 && c.BackupEvery < time.Second:
		return clirun.UsageError{Msg: "give --backup-every a second or more"}
	case c.BackupKeep < 1:
		return clirun.UsageError{Msg: "give --backup-keep 1 or more"}
	case c.Lease < time.Second:
		return clirun.UsageError{Msg: "give --lease a second or more"}
	case c.HostCredentials < 10*time.Second:
		return clirun.UsageError{Msg: "give --host-credentials-ttl ten seconds or more"}
	}
	if c.AlertWebhook != "" {
		if _, err := alerthook.Parse(c.AlertWebhook); err != nil {
			return clirun.UsageError{Msg: "--alert-webhook: " + err.Error() + "; give an http or https URL"}
		}
	}
	metricsAt, err := clirun.ListenMetrics(c.Metrics, c.MetricsPublic)
	if err != nil {
		return err
	}
	if metricsAt != nil {
		fmt.Fprintf(env.Stdout, "metrics: http://%s/metrics\n", metricsAt.Addr())
		syncOut(env)
	}
	// Under systemd (Type=notify): READY=1 once this controller serves,
	// and also once it stands by or aside, since that is its work then
	// (STATUS= says which); the watchdog pinged at half its interval.
	var sd service.Notifier
	go sd.Watch(env.Ctx)
	defer sd.Stopping()
	err = srv.Serve(env.Ctx, app.ServeOptions{
		Metrics:             metricsAt,
		Listen:              c.Listen,
		Log:                 env.Stderr,
		LogFormat:           c.LogFormat,
		LogLevel:            c.LogLevel,
		Version:             version,
		LeaseTTL:            c.Lease,
		CheckEvery:          c.CheckEvery,
		CatchUpEvery:        c.CatchUpEvery,
		BoundsFromDurations: c.BoundsFromDurations,
		MemoryLimit:         c.MemoryLimitMiB << 20,
		BackupEvery:         c.BackupEvery,
		BackupDir:           c.BackupDir,
		BackupKeep:          c.BackupKeep,
		AlertWebhook:        c.AlertWebhook,
		HostCredentials:     c.HostCredentials,
		Ready: func(r app.Ready) {
			fmt.Fprintf(env.Stdout, "ready: broker %s, data %s\n", r.BrokerURL, r.DataDir)
			syncOut(env)
			sd.Ready(fmt.Sprintf("serving: broker %s, data %s", r.BrokerURL, r.DataDir))
		},
		Standing: func(l identity.Lease) {
			older := ""
			if l.Version == "" {
				older = "; it is an older mesh-controller: the stores are migrated then"
			}
			fmt.Fprintf(env.Stdout, "standby: pid %d on %s serves (lease generation %d) until %s; taking over when its lease lapses%s\n",
				l.PID, l.Host, l.Generation, l.ExpiresAt.UTC().Format(time.RFC3339), older)
			syncOut(env)
			sd.Ready(fmt.Sprintf("standby: pid %d on %s serves; taking over when its lease lapses", l.PID, l.Host))
		},
		Aside: func(why string) {
			fmt.Fprintf(env.Stdout, "aside: %s; this controller never takes the lease\n", why)
			syncOut(env)
			sd.Ready("aside: " + why)
		},
		Migrated: func(done []app.Migrated) {
			for _, m := range done {
				fmt.Fprintf(env.Stdout, "migrated: %s %s version %d -> %d\n", m.Context, m.Store, m.From, m.To)
			}
			syncOut(env)
		},
	})
	// The only address serve binds itself (--metrics is opened above) is
	// its embedded broker's: say which, that it is another program's, and
	// how to choose another.
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("the embedded broker cannot listen on %s: something else holds that port (another 'mesh-controller serve', or a NATS server); stop it, or choose another address with --listen HOST:PORT (port 0 picks a free one)", c.Listen)
	}
	return err
}

// syncOut flushes a line a script waits for.
func syncOut(env *Env) {
	if f, ok := env.Stdout.(*os.File); ok {
		f.Sync()
	}
}

// writeHeapProfile writes the heap profile to path, through a temporary
// file so that a reader never sees half of one, and logs the runtime's own
// account of the memory: the heap profile does not count goroutine stacks.
func writeHeapProfile(path string, log io.Writer) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	runtime.GC() // the profile's in-use figures are as of the last collection
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	fmt.Fprintf(log, "heap profile written to %s: heap in use %d MiB, goroutine stacks %d MiB, other runtime %d MiB, from the OS %d MiB, %d goroutines\n",
		path, m.HeapInuse>>20, m.StackInuse>>20, (m.MSpanInuse+m.MCacheInuse+m.BuckHashSys+m.GCSys+m.OtherSys)>>20, m.Sys>>20, runtime.NumGoroutine())
	return nil
}

// BrokerCmd groups broker commands.
type BrokerCmd struct {
	Show BrokerShowCmd `cmd:"" help:"Where hosts should dial, the account, and what each kind of user may do."`
}

// BrokerShowCmd is broker show.
type BrokerShowCmd struct {
	JSON bool `name:"json" help:"Print one JSON object."`
	// Config and the flags after it print a cluster server's configuration.
	Config        bool   `help:"Print the nats-server configuration of one server of a broker cluster (serve --broker with every server's URL): the controller keeps its resolver's account JWTs current."`
	Name          string `placeholder:"NAME" help:"With --config: the server's name, unique in the cluster (default: the placeholder NAME-OF-THIS-SERVER, to fill in)."`
	Listen        string `placeholder:"ADDR" help:"With --config: where its clients dial (default 0.0.0.0:4222)."`
	ClusterListen string `placeholder:"ADDR" help:"With --config: where the other servers route to (default 0.0.0.0:6222)."`
	Routes        string `placeholder:"URLS" help:"With --config: every server's route URL, separated by commas (nats-route://host:6222,…; default: placeholders SERVER-A, SERVER-B, SERVER-C, to fill in)."`
	Dir           string `placeholder:"DIR" help:"With --config: where the server keeps the account JWTs and JetStream's files (default /var/lib/nats)."`
}

// Placeholders of a cluster server's configuration, for what broker show
// --config is not told.
const (
	configName   = "NAME-OF-THIS-SERVER"
	configRoutes = "nats-route://SERVER-A:6222,nats-route://SERVER-B:6222,nats-route://SERVER-C:6222"
)

// Run shows the broker.
func (c *BrokerShowCmd) Run(env *Env, nd *app.Nodes) error {
	if c.Config {
		return c.printConfig(env, nd)
	}
	if c.Name != "" || c.Listen != "" || c.ClusterListen != "" || c.Routes != "" || c.Dir != "" {
		return clirun.UsageError{Msg: "--name, --listen, --cluster-listen, --routes and --dir go with --config"}
	}
	v, err := nd.BrokerShow(env.Ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, v)
	}
	w := env.Stdout
	state := "no controller is serving now"
	if v.Serving {
		state = "a controller is serving"
	}
	if v.External {
		state += "; external broker"
	}
	fmt.Fprintf(w, "urls      %s  (%s)\n", strings.Join(v.URLs, ", "), state)
	fmt.Fprintf(w, "serving   %s\n", v.Controllers)
	fmt.Fprintf(w, "operator  %s\naccount   %s\njoin      %s\nadmit     %s\n\nusers:\n", v.Operator, v.Account, v.JoinAccount, v.AdmitAccount)
	for _, u := range v.Users {
		fmt.Fprintf(w, "  %s\n    publish    %s\n    subscribe  %s\n", u.User, strings.Join(u.Publish, " "), strings.Join(u.Subscribe, " "))
		if u.MaxPayload > 0 {
			fmt.Fprintf(w, "    largest    %d bytes\n", u.MaxPayload)
		}
	}
	if t := v.Trust; t != nil {
		fmt.Fprintf(w, "\nThe external NATS server must trust this controller's operator; add to its configuration:\n\n")
		fmt.Fprintf(w, "operator: %s\nsystem_account: %s\nresolver: MEMORY\nresolver_preload: {\n", t.OperatorJWT, t.SystemAccount)
		for acc, jwt := range t.ResolverPreload {
			fmt.Fprintf(w, "  %s: %s\n", acc, jwt)
		}
		fmt.Fprintf(w, "}\ndefault_sentinel: %s\n", t.DefaultSentinel)
		fmt.Fprintf(w, "\nWith a full resolver instead, the controller gives the servers revocations itself: 'mesh-controller broker show --config'.\n")
	}
	return nil
}

// printConfig prints a cluster server's configuration; what it is not told
// is a placeholder or a default.
func (c *BrokerShowCmd) printConfig(env *Env, nd *app.Nodes) error {
	if c.JSON {
		return clirun.UsageError{Msg: "--config prints a nats-server configuration, not JSON"}
	}
	n := app.BrokerConfigRequest{Name: c.Name, Listen: c.Listen, ClusterListen: c.ClusterListen, Dir: c.Dir}
	routes := c.Routes
	for _, d := range []struct {
		v   *string
		def string
	}{{&n.Name, configName}, {&n.Listen, "0.0.0.0:4222"}, {&n.ClusterListen, "0.0.0.0:6222"}, {&routes, configRoutes}, {&n.Dir, "/var/lib/nats"}} {
		if *d.v == "" {
			*d.v = d.def
		}
	}
	n.Routes = strings.Split(routes, ",")
	conf, err := nd.BrokerConfig(env.Ctx, n)
	if err != nil {
		return err
	}
	_, err = io.WriteString(env.Stdout, conf)
	return err
}
