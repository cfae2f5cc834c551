// Command hello is the example module of mesh-controller's tests and demo:
// a small program run by a host's supervisor as its manifest (mesh.json)
// says. It reads its settings, keeps a count of its starts in its data
// dir, listens on its declared port, says it started on its emits subject,
// and answers its tool, greet, with its own broker user.
package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
)

type settings struct {
	Greeting string `json:"greeting"`
	Port     int    `json:"port"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "hello: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	node, module := os.Getenv("MESH_NODE"), os.Getenv("MESH_MODULE")
	s := settings{Greeting: "hello", Port: 18480}
	if p := os.Getenv("MESH_SETTINGS"); p != "" {
		b, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("read settings: %w", err)
		}
		if err := json.Unmarshal(b, &s); err != nil {
			return fmt.Errorf("settings: %w", err)
		}
	}
	data := os.Getenv("MESH_DATA_STATE")
	if data == "" {
		return fmt.Errorf("MESH_DATA_STATE is not set: run me from a mesh host")
	}
	starts, err := countStart(filepath.Join(data, "starts"))
	if err != nil {
		return err
	}
	fmt.Printf("hello %s on %s: start %d, greeting %q, pid %d\n", os.Getenv("MESH_VERSION"), node, starts, s.Greeting, os.Getpid())

	creds := os.Getenv("MESH_BROKER_CREDS")
	if creds == "" {
		return fmt.Errorf("MESH_BROKER_CREDS is not set: no broker user for me")
	}
	nc, err := nats.Connect(os.Getenv("MESH_BROKER"), nats.UserCredentials(creds), nats.Name(module+" on "+node),
		nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("connect to the broker: %w", err)
	}
	defer nc.Close()
	greet := func(m *nats.Msg) {
		var in struct {
			Name string `json:"name"`
		}
		_ = json.Unmarshal(m.Data, &in)
		to := in.Name
		if to == "" {
			to = "you"
		}
		out, _ := json.Marshal(map[string]any{"greeting": s.Greeting + ", " + to, "node": node, "starts": starts, "pid": os.Getpid()})
		fmt.Printf("asked greet for %q\n", to)
		_ = m.Respond(out)
	}
	// Any instance answers mesh.tool.hello.greet (one of a queue group);
	// this one alone answers mesh.tool.hello.greet.<node>.
	if _, err := nc.QueueSubscribe("mesh.tool."+module+".greet", module, greet); err != nil {
		return err
	}
	if _, err := nc.Subscribe("mesh.tool."+module+".greet."+node, greet); err != nil {
		return err
	}
	started, _ := json.Marshal(map[string]any{"node": node, "starts": starts, "at": time.Now().UTC()})
	if err := nc.Publish("mesh.module.hello.started", started); err != nil {
		return err
	}
	if err := nc.Flush(); err != nil {
		return fmt.Errorf("the broker did not take my subscriptions: %w", err)
	}
	fmt.Println("answering greet")

	// The port is its ready check: it listens once it can answer.
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(s.Port))
	if err != nil {
		return err
	}
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "%s from %s\n", s.Greeting, node)
	}))
	fmt.Printf("listening on %s\n", ln.Addr())

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
	got := <-stop
	fmt.Printf("stopping on %s\n", got)
	return nil
}

// countStart adds one to the count kept in file and returns it.
func countStart(file string) (int, error) {
	n := 0
	if b, err := os.ReadFile(file); err == nil {
		n, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	n++
	return n, os.WriteFile(file, []byte(strconv.Itoa(n)+"\n"), 0o600)
}
