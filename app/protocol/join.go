package protocol

import (
	"encoding/json"
	"fmt"

	"filippo.io/age"
)

// maxGrant bounds what opening a join answer reads: a grant is a user JWT,
// a key and a few URLs.
const maxGrant = 64 << 10

// SealJoinGrant seals a grant to the age recipient a joining host sent, as
// ASCII armor: only the holder of its identity opens it.
func SealJoinGrant(g JoinGrant, recipient string) (string, error) {
	r, err := age.ParseX25519Recipient(recipient)
	if err != nil {
		return "", fmt.Errorf("age_recipient: %w", err)
	}
	b, err := json.Marshal(g)
	if err != nil {
		return "", err
	}
	return sealArmored(b, r)
}

// OpenJoinGrant opens a sealed grant with the joining host's age identity,
// and checks it is for node.
func OpenJoinGrant(sealed string, id age.Identity, node string) (JoinGrant, error) {
	b, err := openArmored(sealed, maxGrant, id)
	if err != nil {
		return JoinGrant{}, fmt.Errorf("open the join answer: %w", err)
	}
	var g JoinGrant
	if err := json.Unmarshal(b, &g); err != nil {
		return JoinGrant{}, fmt.Errorf("the join answer: %w", err)
	}
	if g.Node != node {
		return JoinGrant{}, fmt.Errorf("the join answer is for node %q, not %q", g.Node, node)
	}
	return g, nil
}
