package host

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// A connection the broker took but whose handshake it did not finish in
// time is a busy broker, asked again; one no broker took is not. The
// errors are as nats.go (v1.55) makes them: a read past the handshake's
// deadline, and the server's first ping read where its answer to the
// client's was expected (sendConnect).
func TestHandshakeBusy(t *testing.T) {
	// A dial that timed out, as net makes it: no broker took the connection.
	ctx, cancel := context.WithTimeout(context.Background(), -time.Second)
	defer cancel()
	_, dialTimeout := (&net.Dialer{}).DialContext(ctx, "tcp", "127.0.0.1:1")
	if dialTimeout == nil {
		t.Fatal("a dial past its deadline succeeded")
	}
	for err, want := range map[error]bool{
		dialTimeout: false,
		&net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}: true,
		fmt.Errorf("nats: expected '%s', got '%s'", "PONG", "PING"):       true,
		nats.ErrTimeout: true,
		&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}: false,
		nats.ErrNoServers: false,
		errors.New("nats: authorization violation"): false,
	} {
		if got := handshakeBusy(err); got != want {
			t.Errorf("%v: busy %v, want %v", err, got, want)
		}
	}
}
