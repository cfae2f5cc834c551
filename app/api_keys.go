package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	jose "github.com/go-jose/go-jose/v4"
)

// KeyRefetchEvery is how often, at most, the API fetches its issuer's keys
// again for a token naming a key it does not hold: go-oidc's own key set
// fetches them for every such token, so that anyone could make the API
// hammer the issuer (and wait on it) by sending made-up key ids. An
// issuer's rotation is picked up within this time; one that publishes its
// next key before it signs with it (as issuers do) is not noticed at all.
const KeyRefetchEvery = 30 * time.Second

// maxJWKSBytes bounds the issuer's key set as read: a few keys are a few
// kilobytes.
const maxJWKSBytes = 1 << 20

// apiAlgs are the signature algorithms a token may name (go-oidc's own
// list); the verifier narrows them to the issuer's.
var apiAlgs = []jose.SignatureAlgorithm{jose.RS256, jose.RS384, jose.RS512, jose.ES256, jose.ES384, jose.ES512,
	jose.PS256, jose.PS384, jose.PS512, jose.EdDSA}

// TokenVerifierOptions tune NewTokenVerifier.
type TokenVerifierOptions struct {
	// Client reads the discovery document and the keys; nil is a client
	// that gives up after 10 s, so that an issuer that stops answering
	// costs a bounded wait, not a hung request.
	Client *http.Client
	// RefetchEvery is how often, at most, the keys are fetched again;
	// zero is KeyRefetchEvery.
	RefetchEvery time.Duration
}

// NewTokenVerifier reads the issuer's discovery document and verifies tokens
// against its keys: fetched when first needed, then again when a token names
// a key not held, at most once every RefetchEvery (an issuer's key rotation);
// a token naming an unknown key meanwhile is refused without a fetch.
func NewTokenVerifier(ctx context.Context, issuer, audience string, o TokenVerifierOptions) (*oidc.IDTokenVerifier, error) {
	if o.Client == nil {
		o.Client = &http.Client{Timeout: 10 * time.Second}
	}
	if o.RefetchEvery <= 0 {
		o.RefetchEvery = KeyRefetchEvery
	}
	p, err := oidc.NewProvider(oidc.ClientContext(ctx, o.Client), issuer)
	if err != nil {
		return nil, err
	}
	var doc struct {
		JWKS string   `json:"jwks_uri"`
		Algs []string `json:"id_token_signing_alg_values_supported"`
	}
	if err := p.Claims(&doc); err != nil {
		return nil, err
	}
	if doc.JWKS == "" {
		return nil, errors.New("its discovery document names no jwks_uri")
	}
	var algs []string
	for _, a := range doc.Algs {
		for _, known := range apiAlgs {
			if a == string(known) {
				algs = append(algs, a)
			}
		}
	}
	ks := &apiKeySet{url: doc.JWKS, client: o.Client, every: o.RefetchEvery, now: time.Now}
	return oidc.NewVerifier(issuer, ks, &oidc.Config{ClientID: audience, SupportedSigningAlgs: algs}), nil
}

// apiKeySet is the issuer's keys as last fetched, fetched again at most
// once every every, one fetch at a time. It is go-oidc's KeySet: the
// verifier checks the token's algorithm, issuer, audience and expiry.
type apiKeySet struct {
	url    string
	client *http.Client
	every  time.Duration
	now    func() time.Time

	fetching sync.Mutex // held by the one fetch under way

	mu      sync.RWMutex
	keys    []jose.JSONWebKey
	fetched time.Time // when a fetch was last tried, whatever came of it
	gen     int       // counts the fetches that replaced keys
}

// VerifySignature checks the token's signature with the key it names (any
// key when it names none) and returns its payload.
func (k *apiKeySet) VerifySignature(ctx context.Context, raw string) ([]byte, error) {
	jws, err := jose.ParseSignedCompact(raw, apiAlgs)
	if err != nil {
		return nil, fmt.Errorf("malformed token: %v", err)
	}
	kid := jws.Signatures[0].Header.KeyID // a compact token has exactly one
	payload, gen, ok := k.verify(jws, kid)
	if ok {
		return payload, nil
	}
	if err := k.refetch(ctx, gen, kid); err != nil {
		return nil, err
	}
	if payload, _, ok := k.verify(jws, kid); ok {
		return payload, nil
	}
	return nil, fmt.Errorf("signed with key %q, which the issuer does not publish", kid)
}

// verify tries the keys held that kid names; gen is their generation.
func (k *apiKeySet) verify(jws *jose.JSONWebSignature, kid string) ([]byte, int, bool) {
	k.mu.RLock()
	keys, gen := k.keys, k.gen
	k.mu.RUnlock()
	for i := range keys {
		if kid == "" || keys[i].KeyID == kid {
			if payload, err := jws.Verify(&keys[i]); err == nil {
				return payload, gen, true
			}
		}
	}
	return nil, gen, false
}

// refetch fetches the keys again, unless another request did since the
// keys of generation seen were tried (then they are tried again) or a
// fetch was tried less than every ago (then the token is refused).
func (k *apiKeySet) refetch(ctx context.Context, seen int, kid string) error {
	k.fetching.Lock()
	defer k.fetching.Unlock()
	k.mu.RLock()
	gen, last := k.gen, k.fetched
	k.mu.RUnlock()
	if gen != seen {
		return nil
	}
	if now := k.now(); !last.IsZero() && now.Sub(last) < k.every {
		return fmt.Errorf("signed with key %q, not among the issuer's keys fetched %s ago (they are fetched again at most every %s)",
			kid, now.Sub(last).Round(time.Second), k.every)
	}
	keys, err := k.fetch(ctx)
	k.mu.Lock()
	defer k.mu.Unlock()
	k.fetched = k.now()
	if err != nil {
		return fmt.Errorf("fetch the issuer's keys: %w", err)
	}
	k.keys, k.gen = keys, k.gen+1
	return nil
}

// fetch reads the issuer's key set. Keys of a kind go-jose does not know
// (or not for signing) are left out, not the whole set.
func (k *apiKeySet) fetch(ctx context.Context) ([]jose.JSONWebKey, error) {
	req, err := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodGet, k.url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Cache-Control", "no-cache")
	resp, err := k.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBytes+1))
	switch {
	case err != nil:
		return nil, err
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("%s answered %s", k.url, resp.Status)
	case len(body) > maxJWKSBytes:
		return nil, fmt.Errorf("%s answered more than %d bytes", k.url, maxJWKSBytes)
	}
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(body, &set); err != nil {
		return nil, fmt.Errorf("%s answered no key set: %v", k.url, err)
	}
	var keys []jose.JSONWebKey
	for _, raw := range set.Keys {
		var key jose.JSONWebKey
		if json.Unmarshal(raw, &key) == nil && key.Valid() && key.IsPublic() && (key.Use == "" || key.Use == "sig") {
			keys = append(keys, key)
		}
	}
	return keys, nil
}
