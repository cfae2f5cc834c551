package inventory

import (
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"net/netip"
	"time"

	"mesh-controller/embedded/sqlite"
)

// Reach says how a node is reached on the overlay.
type Reach string

const (
	// Public: the node's endpoint can be dialled from anywhere.
	Public Reach = "public"
	// BehindNAT: the node dials out; nothing dials it from outside its site.
	BehindNAT Reach = "behind-nat"
)

// Placement is where a node is and how it is reached (overlay place);
// the zero value is a node not placed.
type Placement struct {
	// Endpoint is host:port, "" for none.
	Endpoint string
	// Site is the site's name, "" for none.
	Site string
	// Reach is Public, BehindNAT or "" (not placed).
	Reach Reach
}

// OverlayNode is a node's part of the overlay as the store keeps it.
type OverlayNode struct {
	Name string
	// Index is the node's overlay index: its addresses are the overlay's
	// prefixes plus it. Taken when the node was recorded, never reused.
	Index     int64
	Placement Placement
	// Key is the WireGuard public key its host reported
	// (the fact wireguard_key), "" if none yet; judged by the application.
	Key string
}

// Overlay is what the overlay is computed from: the mesh's ULA /48 ("" if
// not made yet) and every node's part, by name.
type Overlay struct {
	Prefix6 string
	Nodes   []OverlayNode
}

// factWireGuardKey is protocol.FactWireGuardKey (a context does not import
// the application's protocol package).
const factWireGuardKey = "wireguard_key"

// newOverlayPrefix makes a random IPv6 ULA /48 (RFC 4193: fd, then 40
// random bits), written as netip writes it (no leading zeros in a group):
// the text is compared with prefixes parsed back.
func newOverlayPrefix() (string, error) {
	var a [16]byte
	a[0] = 0xfd
	if _, err := rand.Read(a[1:6]); err != nil {
		return "", err
	}
	return netip.PrefixFrom(netip.AddrFrom16(a), 48).String(), nil
}

// ensureOverlayPrefix makes the mesh's ULA prefix if it has none yet.
func ensureOverlayPrefix(ctx context.Context, tx *sql.Tx) error {
	var prefix sql.NullString
	if err := tx.QueryRowContext(ctx, `SELECT prefix FROM overlay_mesh WHERE id = 1`).Scan(&prefix); err != nil {
		return fmt.Errorf("read the overlay's prefix: %w", err)
	}
	if prefix.Valid {
		return nil
	}
	p, err := newOverlayPrefix()
	if err != nil {
		return fmt.Errorf("make the overlay's prefix: %w", err)
	}
	_, err = tx.ExecContext(ctx, `UPDATE overlay_mesh SET prefix = ? WHERE id = 1 AND prefix IS NULL`, p)
	return err
}

// EnsureOverlayPrefix makes the mesh's ULA prefix once (migrate calls it,
// so a mesh recorded before the overlay existed has one too).
func (s *Store) EnsureOverlayPrefix(ctx context.Context) (err error) {
	defer s.db.Failing(&err, "make the overlay's prefix")
	return s.db.Write(ctx, func(tx *sql.Tx) error { return ensureOverlayPrefix(ctx, tx) })
}

// takeOverlayIndex gives a node just recorded the next overlay index,
// moving the counter: in the transaction that records it.
func takeOverlayIndex(ctx context.Context, tx *sql.Tx, node string) error {
	if err := ensureOverlayPrefix(ctx, tx); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `UPDATE nodes SET overlay_index = (SELECT next_index FROM overlay_mesh WHERE id = 1) WHERE name = ?`, node); err != nil {
		return fmt.Errorf("give node %s its overlay index: %w", node, err)
	}
	_, err := tx.ExecContext(ctx, `UPDATE overlay_mesh SET next_index = next_index + 1 WHERE id = 1`)
	return err
}

// OverlayPrefix is the mesh's ULA prefix, "" until it is made.
func (s *Store) OverlayPrefix(ctx context.Context) (_ string, err error) {
	defer s.db.Failing(&err, "read the overlay's prefix")
	var prefix sql.NullString
	if err := s.db.Reader.QueryRowContext(ctx, `SELECT prefix FROM overlay_mesh WHERE id = 1`).Scan(&prefix); err != nil {
		return "", err
	}
	return prefix.String, nil
}

// ReadOverlay reads what the overlay is computed from, in one transaction.
func (s *Store) ReadOverlay(ctx context.Context) (_ Overlay, err error) {
	defer s.db.Failing(&err, "read the overlay")
	tx, err := s.db.Reader.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return Overlay{}, err
	}
	defer tx.Rollback()
	o, err := readOverlay(ctx, tx)
	if err != nil {
		return Overlay{}, err
	}
	return o, nil
}

func readOverlay(ctx context.Context, tx *sql.Tx) (Overlay, error) {
	var o Overlay
	var prefix sql.NullString
	if err := tx.QueryRowContext(ctx, `SELECT prefix FROM overlay_mesh WHERE id = 1`).Scan(&prefix); err != nil {
		return Overlay{}, err
	}
	o.Prefix6 = prefix.String
	err := each(ctx, tx, `SELECT n.name, n.overlay_index, coalesce(n.overlay_endpoint, ''), coalesce(n.overlay_site, ''), coalesce(n.overlay_reach, ''), coalesce(f.value, '')
		FROM nodes n LEFT JOIN node_facts f ON f.node = n.name AND f.name = ?
		WHERE n.overlay_index IS NOT NULL ORDER BY n.name`, func(r *sql.Rows) error {
		var n OverlayNode
		var reach string
		if err := r.Scan(&n.Name, &n.Index, &n.Placement.Endpoint, &n.Placement.Site, &reach, &n.Key); err != nil {
			return err
		}
		n.Placement.Reach = Reach(reach)
		o.Nodes = append(o.Nodes, n)
		return nil
	}, factWireGuardKey)
	return o, err
}

// SetPlacement keeps where a node is and how it is reached and, if that
// changed, moves in the same transaction the plans of the nodes moved
// names (the application judges whose overlay part the change alters,
// from the overlay before and after). changed says whether it did change.
func (s *Store) SetPlacement(ctx context.Context, node string, p Placement, moved func(before, after Overlay) []string) (changed bool, err error) {
	defer s.db.Failing(&err, "place node %s", node)
	nullable := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		// An act: judged acts committing after it are judged again.
		if err := moveRevision(ctx, tx, 0); err != nil {
			return err
		}
		if err := mustExist(ctx, tx, node); err != nil {
			return err
		}
		if err := ensureOverlayPrefix(ctx, tx); err != nil {
			return err
		}
		before, err := readOverlay(ctx, tx)
		if err != nil {
			return err
		}
		ep, site, reach := nullable(p.Endpoint), nullable(p.Site), nullable(string(p.Reach))
		res, err := tx.ExecContext(ctx, `UPDATE nodes SET overlay_endpoint = ?1, overlay_site = ?2, overlay_reach = ?3
			WHERE name = ?4 AND (overlay_endpoint IS DISTINCT FROM ?1 OR overlay_site IS DISTINCT FROM ?2 OR overlay_reach IS DISTINCT FROM ?3)`,
			ep, site, reach, node)
		if err != nil {
			return err
		}
		n, _ := res.RowsAffected()
		if changed = n > 0; !changed {
			return nil
		}
		after, err := readOverlay(ctx, tx)
		if err != nil {
			return err
		}
		return bump(ctx, tx, moved(before, after))
	})
	if err != nil {
		return false, err
	}
	return changed, err
}

// SilentPeer is a direct overlay peer a node's host has not heard from
// lately (node.overlay-peer-silent).
type SilentPeer struct {
	Node, Peer string
	// Since is when it was found silent.
	Since time.Time
	// LastHandshake is nil for none ever.
	LastHandshake *time.Time
}

// PeerFlip is a pair of overlay peers turning silent, or heard again.
type PeerFlip struct {
	Node, Peer string
	Silent     bool
	At         time.Time
	// LastHandshake is the handshake last heard, nil for none.
	LastHandshake *time.Time
}

// SilentPeers returns every silent pair, by node and peer.
func (s *Store) SilentPeers(ctx context.Context) (_ []SilentPeer, err error) {
	defer s.db.Failing(&err, "read silent overlay peers")
	rows, err := s.db.Reader.QueryContext(ctx, `SELECT node, peer, since, last_handshake FROM overlay_silent_peers ORDER BY node, peer`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []SilentPeer
	for rows.Next() {
		var p SilentPeer
		var since string
		var last sql.NullString
		if err := rows.Scan(&p.Node, &p.Peer, &since, &last); err != nil {
			return nil, err
		}
		if p.Since, err = sqlite.ParseTime(since); err != nil {
			return nil, err
		}
		if p.LastHandshake, err = sqlite.ParseNullTime(last); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// RecordPeerFlips keeps pairs turning silent and forgets those heard again,
// in one transaction. A flip for a node no longer recorded is dropped.
func (s *Store) RecordPeerFlips(ctx context.Context, flips []PeerFlip) (err error) {
	defer s.db.Failing(&err, "record overlay peers silent or heard")
	if len(flips) == 0 {
		return nil
	}
	err = s.db.Write(ctx, func(tx *sql.Tx) error {
		for _, f := range flips {
			if !f.Silent {
				if _, err := tx.ExecContext(ctx, `DELETE FROM overlay_silent_peers WHERE node = ? AND peer = ?`, f.Node, f.Peer); err != nil {
					return err
				}
				continue
			}
			var last any
			if f.LastHandshake != nil {
				last = sqlite.FormatTime(*f.LastHandshake)
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO overlay_silent_peers (node, peer, since, last_handshake)
				SELECT name, ?, ?, ? FROM nodes WHERE name = ?
				ON CONFLICT (node, peer) DO UPDATE SET last_handshake = excluded.last_handshake`,
				f.Peer, sqlite.FormatTime(f.At), last, f.Node); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return nil
}
