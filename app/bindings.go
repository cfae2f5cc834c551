package app

import (
	"fmt"

	"filippo.io/age"

	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
	"mesh-controller/contexts/secrets"
)

// keeping is a secret's next sealed copy to keep: v sealed to each node
// recipient (the first is the node the copy is kept for) and, when it is
// kept, to the current operator key.
func keeping(l protocol.Label, madeBy, event string, v protocol.Secret, nodeRecipients ...string) (secrets.Keeping, error) {
	var rs []age.Recipient
	for _, r := range nodeRecipients {
		parsed, err := age.ParseX25519Recipient(r)
		if err != nil {
			return secrets.Keeping{}, fmt.Errorf("%s/%s/%s: a recipient: %w", l.Node, l.Module, l.Name, err)
		}
		rs = append(rs, parsed)
	}
	return secrets.Keeping{Event: event,
		Copy: secrets.Copy{Node: l.Node, Module: l.Module, Name: l.Name, MadeBy: madeBy, NodeRecipient: nodeRecipients[0]},
		Seal: func(version int64, operatorKey string) (string, error) {
			or, err := age.ParseX25519Recipient(operatorKey)
			if err != nil {
				return "", fmt.Errorf("the operator key: %w", err)
			}
			l.Version = version
			return protocol.SealSecret(v, l, append(rs, or)...)
		}}, nil
}

// credentialKeeping is a new credential for one binding, to be sealed to
// both ends (their recipients among those given) and the operator; the old
// value is not kept.
func credentialKeeping(b inventory.Binding, event string, recipients map[string]string) (secrets.Keeping, error) {
	provider, err := recipientOf(recipients, b.Provider.Node)
	if err != nil {
		return secrets.Keeping{}, err
	}
	consumer, err := recipientOf(recipients, b.Node)
	if err != nil {
		return secrets.Keeping{}, err
	}
	v, err := newMeshSecret()
	if err != nil {
		return secrets.Keeping{}, err
	}
	l := protocol.Label{Node: b.Provider.Node, Module: b.Provider.Module, Name: inventory.CredentialName(b.Node, b.Module, b.Provision)}
	return keeping(l, "mesh", event, v, provider, consumer)
}
