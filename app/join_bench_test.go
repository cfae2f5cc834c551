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

// BenchmarkJoin admits hosts as the join worker does: one after another
// (one), and in batches of 128 as under a flood (batched): the controller's
// cost of one join (a rack of 10,000 must join in 15 s).
//
//	go test -run '^$' -bench Join -benchtime 2000x ./app/
func BenchmarkJoin(b *testing.B) {
	for _, batch := range []int{1, 128} {
		name := "one"
		if batch > 1 {
			name = "batched"
		}
		b.Run(name, func(b *testing.B) {
			c, _ := migrated(b)
			ctx := context.Background()
			tokens, err := c.TokenIssueMany(ctx, "h", b.N, false, time.Hour, b.TempDir()+"/tokens")
			if err != nil {
				b.Fatal(err)
			}
			reqs := joinRequests(b, tokens.Out)
			sv, err := c.serving(ctx)
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i += batch {
				for _, r := range sv.joinMany(ctx, reqs[i:min(i+batch, b.N)], []string{"nats://127.0.0.1:4222"}) {
					if r.Err != nil {
						b.Fatal(r.Err)
					}
				}
			}
		})
	}
}

// joinRequests are a host's join request for each token of a token file,
// each with its own keys.
func joinRequests(b *testing.B, file string) []protocol.JoinRequest {
	tokens, err := readTokenFile(file)
	if err != nil {
		b.Fatal(err)
	}
	reqs := make([]protocol.JoinRequest, len(tokens))
	for i := range reqs {
		pub, _, _ := ed25519.GenerateKey(rand.Reader)
		id, _ := age.GenerateX25519Identity()
		nk, _ := nkeys.CreateUser()
		nkPub, _ := nk.PublicKey()
		reqs[i] = protocol.JoinRequest{Token: tokens[i][1], Node: tokens[i][0], HostKey: base64.StdEncoding.EncodeToString(pub),
			AgeRecipient: id.Recipient().String(), NKey: nkPub, HostVersion: "bench"}
	}
	return reqs
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
