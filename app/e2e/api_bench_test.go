package e2e

import (
	"context"
	"io"
	"mesh-controller/app"
	"net/http"
	"testing"
)

// BenchmarkAPIStatus asks GET /v1/status of a mesh of 1,000 nodes (4
// assignments each) through the real server and handler over loopback,
// with a real token of a real issuer verified on each request; compare
// BenchmarkStatus, the same answer without HTTP or a token.
//
//	go test -run '^$' -bench APIStatus ./app/
func BenchmarkAPIStatus(b *testing.B) {
	c := plannedMesh(b, 1000, 4, 40)
	is := newTestIssuer(b)
	base := apiOn(b, c, is, nil)
	tok := is.token(b, nil, []string{"mesh-read"}, nil)
	req, err := http.NewRequest("GET", base+"/v1/status", nil)
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}

// BenchmarkAPIVerify is what verifying a token costs a request once the
// issuer's keys are cached: the signature (RS256, 2048 bits) and the
// claims, no fetch.
//
//	go test -run '^$' -bench APIVerify ./app/
func BenchmarkAPIVerify(b *testing.B) {
	is := newTestIssuer(b)
	ctx := context.Background()
	v, err := app.NewTokenVerifier(ctx, is.m.Issuer(), apiTestAudience, app.TokenVerifierOptions{})
	if err != nil {
		b.Fatal(err)
	}
	tok := is.token(b, nil, []string{"mesh-read"}, nil)
	if _, err := v.Verify(ctx, tok); err != nil { // fetches the keys once
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := v.Verify(ctx, tok); err != nil {
			b.Fatal(err)
		}
	}
}
