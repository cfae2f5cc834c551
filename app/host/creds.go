package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"mesh-controller/app/protocol"
)

// A host's broker user expires (serve --host-credentials-ttl). The host
// renews it when a third of its life is left: a request signed by its host
// key, for a new nkey it makes (so the credential it replaces is useless
// once it expires), answered with a user JWT; the host saves the new
// .creds whole (0600) and reconnects with it at once, so that its
// connection moves to the new user long before the old one expires. A host
// whose credential expired while it was away (it can no longer connect as
// itself) renews through the join path, still token-free: the request
// signed by its host key, the answer sealed to its age identity.

// renewLeft is the part of a credential's life left when its host renews it.
const renewLeft = 3

// renewRetry bounds the wait before a renewal that failed is tried again.
const (
	renewRetryFirst = time.Second
	renewRetryMost  = time.Minute
)

// legacyRenewWithin bounds when a host renews a credential that never
// expires (issued before credentials did): within this of its start, at a
// random point, so a mesh of hosts upgraded at once does not renew at once.
const legacyRenewWithin = 10 * time.Minute

// renewDue is when the host's credential is to be renewed, and when it
// expires (zero: never).
func (s *State) renewDue(started time.Time) (due, expires time.Time, err error) {
	userJWT, _, err := s.parsed()
	if err != nil {
		return time.Time{}, time.Time{}, err
	}
	uc, err := jwt.DecodeUserClaims(userJWT)
	if err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("%s: %w", fileCreds, err)
	}
	if uc.Expires == 0 {
		return started.Add(rand.N(legacyRenewWithin)), time.Time{}, nil
	}
	issued, expires := time.Unix(uc.IssuedAt, 0), time.Unix(uc.Expires, 0)
	life := expires.Sub(issued)
	// A little earlier, at random, so hosts that joined together do not
	// renew together.
	return expires.Add(-life/renewLeft - rand.N(life/20+1)), expires, nil
}

// renewLoop renews the host's credential whenever it is due, until ctx
// ends; a renewal that failed is tried again after a pause.
func (r *Runner) renewLoop(ctx context.Context, nc *nats.Conn) {
	started := time.Now()
	for attempt := 0; ; {
		due, expires, err := r.State.renewDue(started)
		if err != nil {
			r.warnf("renew the broker credential: %v", err)
			return
		}
		wait := time.Until(due)
		if attempt > 0 {
			most := renewRetryMost
			if expires.IsZero() {
				// Nothing runs out: a controller from before renewals is
				// asked again now and then, not every minute.
				most = time.Hour
			}
			wait = max(wait, backoff(attempt, renewRetryFirst, most))
		}
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		expired := !expires.IsZero() && !time.Now().Before(expires)
		if err := r.renew(ctx, nc, expired); err != nil {
			if ctx.Err() != nil {
				return
			}
			attempt++
			if attempt == 1 || attempt%10 == 0 {
				r.warnf("renew the broker credential: %v; trying again (%d tries)", err, attempt)
			}
			continue
		}
		attempt = 0
	}
}

// renew renews the credential: on the host's own connection, or through
// the join path once it expired; the new .creds is saved whole, and the
// connection made again with it.
func (r *Runner) renew(ctx context.Context, nc *nats.Conn, expired bool) error {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return err
	}
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	var userJWT string
	if expired {
		userJWT, err = renewByJoin(ctx, r.State, pub)
	} else {
		userJWT, err = renewOn(ctx, nc, r.State, pub)
	}
	if err != nil {
		return err
	}
	creds, err := jwt.FormatUserConfig(userJWT, seed)
	if err != nil {
		return err
	}
	if err := r.State.setCreds(string(creds)); err != nil {
		return err
	}
	how := "renewed"
	if expired {
		how = "renewed through the join path (it had expired)"
	}
	_, expires, _ := r.State.renewDue(time.Now())
	r.logf("broker credential %s: it lasts until %s", how, expires.UTC().Format(time.RFC3339))
	if nc.IsConnected() {
		// The connection moves to the new user now, not when the old one
		// expires under it.
		if err := nc.ForceReconnect(); err != nil {
			r.warnf("reconnect with the renewed credential: %v", err)
		}
	}
	return nil
}

// renewOn asks for a user for nkey on the host's own connection.
func renewOn(ctx context.Context, nc *nats.Conn, st *State, nkey string) (string, error) {
	req, err := protocol.Sign(st.HostKey, protocol.CredsRenewBody{NKey: nkey})
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, protocol.AnswerTimeout)
	defer cancel()
	m, err := nc.RequestWithContext(ctx, protocol.NodeSubject(st.Node, protocol.CredsRenew), req)
	if err != nil {
		return "", fmt.Errorf("ask the controller: %w", err)
	}
	var reply protocol.CredsReply
	if err := json.Unmarshal(m.Data, &reply); err != nil {
		return "", fmt.Errorf("the controller's answer is not JSON: %w", err)
	}
	if !reply.OK {
		return "", errors.New(reply.Error)
	}
	return jwt.ParseDecoratedJWT([]byte(reply.Creds))
}

// renewByJoin asks for a user for nkey through the join path, with no
// credential: the request signed by the host key.
func renewByJoin(ctx context.Context, st *State, nkey string) (string, error) {
	body, err := protocol.Sign(st.HostKey, protocol.RenewBody{Node: st.Node, NKey: nkey, At: time.Now().UTC()})
	if err != nil {
		return "", err
	}
	req, err := json.Marshal(protocol.JoinRequest{Node: st.Node, NKey: nkey, HostVersion: Version, Renew: body})
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, joinWithin)
	defer cancel()
	reply, err := askToJoin(ctx, JoinOptions{Broker: strings.Join(st.BrokerURLs, ","), Node: st.Node}, req)
	if err != nil {
		return "", err
	}
	if !reply.OK {
		if reply.Error == protocol.JoinRefused {
			return "", fmt.Errorf("%w: %s (join again with a new token: 'mesh-controller token issue %s')", ErrRefused, reply.Error, st.Node)
		}
		return "", errors.New(reply.Error)
	}
	g, err := protocol.OpenJoinGrant(reply.Sealed, st.Age, st.Node)
	if err != nil {
		return "", fmt.Errorf("the controller's answer: %w", err)
	}
	return jwt.ParseDecoratedJWT([]byte(g.Creds))
}

// setCreds keeps a renewed .creds: written whole in the state dir (0600),
// then the one the next connection presents.
func (s *State) setCreds(creds string) error {
	if s.Dir != "" {
		if err := writeFile(filepath.Join(s.Dir, fileCreds), []byte(creds)); err != nil {
			return err
		}
	}
	s.mu.Lock()
	s.Creds = creds
	s.mu.Unlock()
	return nil
}
