package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/oauth2-proxy/mockoidc"
	"github.com/rogpeppe/go-internal/testscript"
)

// cmdOIDC starts a real OpenID Connect issuer (mockoidc) on loopback for
// the scenario, sets $ISSUER to it, and writes a token it signed for the
// api's default audience with each group given, for subject script or the
// whole content of SUBJECT-FILE: oidc FILE=GROUP[@SUBJECT-FILE]...
func cmdOIDC(ts *testscript.TestScript, neg bool, args []string) {
	const usage = "usage: oidc FILE=GROUP[@SUBJECT-FILE]..."
	if neg || len(args) == 0 {
		ts.Fatalf(usage)
	}
	m, err := mockoidc.Run()
	ts.Check(err)
	ts.Defer(func() { m.Shutdown() })
	ts.Setenv("ISSUER", m.Issuer())
	for _, a := range args {
		file, group, ok := strings.Cut(a, "=")
		if !ok {
			ts.Fatalf(usage)
		}
		sub := "script"
		if g, subFile, ok := strings.Cut(group, "@"); ok {
			group, sub = g, ts.ReadFile(subFile)
		}
		tok, err := issuerToken(m, sub, group)
		ts.Check(err)
		ts.Check(os.WriteFile(ts.MkAbs(file), []byte(tok), 0o600))
	}
}

// issuerToken is a token m signed for the api's default audience, an hour
// long, for sub (email ops@example.org) in group.
func issuerToken(m *mockoidc.MockOIDC, sub, group string) (string, error) {
	now := time.Now()
	return m.Keypair.SignJWT(jwt.MapClaims{"iss": m.Issuer(), "aud": "mesh-controller", "sub": sub, "email": "ops@example.org",
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix(), "groups": []string{group}})
}

// cmdTLSCert writes a self-signed certificate for 127.0.0.1 and its key:
// tlscert CERT KEY.
func cmdTLSCert(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: tlscert CERT KEY")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ts.Check(err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	ts.Check(err)
	kder, err := x509.MarshalECPrivateKey(key)
	ts.Check(err)
	ts.Check(os.WriteFile(ts.MkAbs(args[0]), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644))
	ts.Check(os.WriteFile(ts.MkAbs(args[1]), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600))
}

// cmdFreePort sets a variable to a loopback port free a moment ago:
// freeport NAME.
func cmdFreePort(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: freeport NAME")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	ts.Check(err)
	ts.Setenv(args[0], fmt.Sprint(ln.Addr().(*net.TCPAddr).Port))
	ln.Close()
}

// cmdAPICall asks the api and prints the status, then the body: apicall
// METHOD URL TOKEN-FILE [BODY]. It waits (20 s at most) for the api to
// listen; an https URL is trusted with the certificate in $API_CA.
func cmdAPICall(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 3 || len(args) > 4 {
		ts.Fatalf("usage: apicall METHOD URL TOKEN-FILE [BODY]")
	}
	client := &http.Client{Timeout: 10 * time.Second}
	if ca := ts.Getenv("API_CA"); ca != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(ts.ReadFile(ca))) {
			ts.Fatalf("%s holds no certificate", ca)
		}
		client.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	}
	body := ""
	if len(args) == 4 {
		body = args[3]
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		req, err := http.NewRequest(args[0], args[1], strings.NewReader(body))
		ts.Check(err)
		req.Header.Set("Authorization", "Bearer "+ts.ReadFile(args[2]))
		resp, err := client.Do(req)
		if err == nil {
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			ts.Check(err)
			fmt.Fprintf(ts.Stdout(), "%d\n%s", resp.StatusCode, b)
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("the api did not answer in 20 s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
