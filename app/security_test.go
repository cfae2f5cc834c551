package app

import (
	"testing"

	"github.com/nats-io/nats.go"
)

// violations collects the broker's asynchronous permission errors.
type violations chan string

func connectWith(t *testing.T, url string, opts ...nats.Option) (*nats.Conn, violations) {
	t.Helper()
	v := make(violations, 16)
	opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { v <- err.Error() }))
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc, v
}
