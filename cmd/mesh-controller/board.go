package main

import (
	"context"
	"errors"
	"fmt"
	"mesh-controller/app"
	"net"
	"net/http"
	"time"
)

// BoardCmd is board.
type BoardCmd struct {
	Listen string   `default:"127.0.0.1:8080" placeholder:"ADDR" help:"Where the page is served."`
	Host   []string `placeholder:"NAME" help:"Another name the page answers to (behind a proxy, say); by default only the address it listens on."`
}

// Run serves the page until SIGINT or SIGTERM. It holds nothing and writes nothing.
func (c *BoardCmd) Run(env *Env, hl *app.Health) error {
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: hl.BoardHandler(app.BoardHosts(ln.Addr().String(), c.Host...)...), ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(env.Stdout, "board: http://%s/\n", ln.Addr())
	go func() {
		<-env.Ctx.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
