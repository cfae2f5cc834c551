package app

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/nats-io/nkeys"

	"mesh-controller/app/protocol"
)

// BenchmarkJoin admits hosts one after another, as the join worker does:
// the controller's cost of one join (a rack of 10,000 must join in 15 s).
//
//	go test -run '^$' -bench Join -benchtime 2000x ./app/
func BenchmarkJoin(b *testing.B) {
	c, _ := migrated(b)
	ctx := context.Background()
	batch, err := c.TokenIssueMany(ctx, "h", b.N, false, time.Hour, b.TempDir()+"/tokens")
	if err != nil {
		b.Fatal(err)
	}
	tokens, err := readTokenFile(batch.Out)
	if err != nil {
		b.Fatal(err)
	}
	reqs := make([]protocol.JoinRequest, b.N)
	for i := range reqs {
		pub, _, _ := ed25519.GenerateKey(rand.Reader)
		id, _ := age.GenerateX25519Identity()
		nk, _ := nkeys.CreateUser()
		nkPub, _ := nk.PublicKey()
		reqs[i] = protocol.JoinRequest{Token: tokens[i][1], Node: tokens[i][0], HostKey: base64.StdEncoding.EncodeToString(pub),
			AgeRecipient: id.Recipient().String(), NKey: nkPub, HostVersion: "bench"}
	}
	sv, err := c.serving(ctx)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := sv.join(ctx, reqs[i], []string{"nats://127.0.0.1:4222"}); err != nil {
			b.Fatal(err)
		}
	}
}

func readTokenFile(path string) ([][2]string, error) {
	b, err := ReadInput(path, 1<<30, "tokens")
	if err != nil {
		return nil, err
	}
	var out [][2]string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			out = append(out, [2]string{f[0], f[1]})
		}
	}
	return out, nil
}
