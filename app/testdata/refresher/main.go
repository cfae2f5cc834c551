// Command refresher is the test manager module of mesh-controller's
// licence tests: run by a real host as its manifest says, it answers its
// tool refresh ({"licence": NAME}) with a new access token each time (with
// REFRESHER_MODE=bad, with each answer a manager must not give in turn),
// made from the refresh token its host wrote for it (the file named by
// MESH_REFRESH_<NAME>): a missing or empty file is answered with an
// error, so an answer proves the refresh token arrived. It never prints
// a token.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "refresher: %v\n", err)
		os.Exit(1)
	}
}

// Token is the access token the n-th refresh answers for a refresh token:
// the tests make the same.
func Token(refresh []byte, n int64) string {
	sum := sha256.Sum256(append(append([]byte(nil), refresh...), []byte("/"+strconv.FormatInt(n, 10))...))
	return "access-" + hex.EncodeToString(sum[:20])
}

func run() error {
	node, module := os.Getenv("MESH_NODE"), os.Getenv("MESH_MODULE")
	life, err := time.ParseDuration(os.Getenv("REFRESHER_LIFE"))
	if err != nil {
		life = time.Hour
	}
	nc, err := nats.Connect(os.Getenv("MESH_BROKER"), nats.UserCredentials(os.Getenv("MESH_BROKER_CREDS")), nats.Name(module+" on "+node),
		nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("connect to the broker: %w", err)
	}
	defer nc.Close()
	var n atomic.Int64
	refresh := func(m *nats.Msg) {
		var in struct {
			Licence string `json:"licence"`
		}
		_ = json.Unmarshal(m.Data, &in)
		env := "MESH_REFRESH_" + strings.ToUpper(strings.ReplaceAll(in.Licence, "-", "_"))
		rt, err := os.ReadFile(os.Getenv(env))
		if err != nil || len(rt) == 0 {
			fmt.Printf("asked to refresh %q: no refresh token in %s\n", in.Licence, env)
			out, _ := json.Marshal(map[string]string{"error": "no refresh token for " + in.Licence + " (" + env + ")"})
			_ = m.Respond(out)
			return
		}
		i := n.Add(1)
		if os.Getenv("REFRESHER_MODE") == "bad" {
			// The answers a manager must not give, in turn.
			bad := [][]byte{[]byte(`{"error": "the provider refused"}`), []byte(`{"expires_at": "2099-01-01T00:00:00Z"}`),
				[]byte(`{"access_token": "` + Token(rt, i) + `", "expires_at": "2001-01-01T00:00:00Z"}`), []byte(`not json`)}
			fmt.Printf("refreshed %s badly (%d)\n", in.Licence, i)
			_ = m.Respond(bad[(i-1)%int64(len(bad))])
			return
		}
		out, _ := json.Marshal(map[string]string{"access_token": Token(rt, i), "expires_at": time.Now().Add(life).UTC().Format(time.RFC3339)})
		clear(rt)
		fmt.Printf("refreshed %s (%d)\n", in.Licence, i)
		_ = m.Respond(out)
	}
	if _, err := nc.Subscribe("mesh.tool."+module+".refresh."+node, refresh); err != nil {
		return err
	}
	if err := nc.Flush(); err != nil {
		return fmt.Errorf("the broker did not take my subscription: %w", err)
	}
	// The port is its ready check: it listens once it can answer.
	ln, err := net.Listen("tcp", "127.0.0.1:"+os.Getenv("REFRESHER_PORT"))
	if err != nil {
		return err
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	fmt.Println("answering refresh")
	// A file in its data dir, if it has one, says so to scenarios.
	if dir := os.Getenv("MESH_DATA_STATE"); dir != "" {
		if err := os.WriteFile(filepath.Join(dir, "answering"), nil, 0o600); err != nil {
			return err
		}
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
	<-stop
	return nil
}
