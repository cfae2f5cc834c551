package daemon

import (
	"context"
	"encoding/json"
	"strings"

	"github.com/nats-io/nats.go"

	"mesh-controller/app/protocol"
)

// backupWorkers bounds the holder's requests handled at once: a due line
// waits for the data's host to take its ask.
const backupWorkers = 8

// subscribeBackups subscribes to what the backup seat's holder and the
// data's hosts say of backups (protocol's backup.go), when the daemon
// serves them.
func (d *daemon) subscribeBackups(subs map[string]nats.MsgHandler) {
	if d.u.Backups == nil {
		return
	}
	d.backupSlots = make(chan struct{}, backupWorkers)
	subs[protocol.BackupDueSubject("*")] = d.fromHolder("a due line", protocol.BackupDueSubject(""), func(ctx context.Context, holder string, data []byte) error {
		var due protocol.BackupDue
		if err := json.Unmarshal(data, &due); err != nil {
			return err
		}
		return d.u.Backups.BackupDue(ctx, d.nc, holder, due)
	})
	subs[protocol.BackupAccessSubject("*")] = d.fromHolder("an access", protocol.BackupAccessSubject(""), func(ctx context.Context, holder string, data []byte) error {
		var a protocol.BackupAccessIssued
		if err := json.Unmarshal(data, &a); err != nil {
			return err
		}
		return d.u.Backups.BackupAccess(ctx, holder, a)
	})
	subs[protocol.DrillSubject("*")] = d.fromHolder("a drill", protocol.DrillSubject(""), func(ctx context.Context, holder string, data []byte) error {
		var o protocol.DrillOutcome
		if err := json.Unmarshal(data, &o); err != nil {
			return err
		}
		return d.u.Backups.BackupDrilled(ctx, holder, o)
	})
	subs[protocol.NodeWildcard(protocol.BackedUp)] = d.onBackedUp
}

// fromHolder handles a request of the backup holder on the node its
// subject names (only that node's holder may publish there), off the
// subscription's goroutine, answered OKReply only into its own inbox.
func (d *daemon) fromHolder(what, prefix string, do func(ctx context.Context, holder string, data []byte) error) nats.MsgHandler {
	return func(m *nats.Msg) {
		holder := strings.TrimPrefix(m.Subject, prefix)
		inbox := protocol.BackupInboxPrefix(holder) + "."
		if !protocol.ValidName(holder) || !strings.HasPrefix(m.Reply, inbox) || len(m.Reply) == len(inbox) {
			d.dropAnswer(what, holder, "answer outside its inbox")
			return
		}
		select {
		case d.backupSlots <- struct{}{}:
		default:
			d.respond(m, protocol.OKReply{Error: "busy: ask again in a moment"})
			return
		}
		go func() {
			defer func() { <-d.backupSlots }()
			reply := protocol.OKReply{OK: true}
			if err := do(d.bg, holder, m.Data); err != nil {
				d.deposed(err)
				reply = protocol.OKReply{Error: err.Error()}
				d.log.Warn("the backup holder's request refused", "what", what, "node", holder, "err", err)
			}
			d.respond(m, reply)
			d.kick() // a drill or an access moves conditions and plans now
		}()
	}
}

// onBackedUp records a host's outcome of a backup or a restore.
func (d *daemon) onBackedUp(m *nats.Msg) {
	var o protocol.BackupOutcome
	node, ok := d.verify(m, protocol.BackedUp, &o)
	if !ok {
		return
	}
	if len(o.Why) > maxTextLen || len(o.Aside) > maxTextLen || len(o.Reason) > maxTextLen || len(o.ID) > 128 {
		d.refuse(m, node, "a backup outcome longer than a report may be")
		return
	}
	reply := protocol.OKReply{OK: true}
	if err := d.u.Backups.BackedUp(d.bg, node, o); err != nil {
		d.deposed(err)
		reply = protocol.OKReply{Error: err.Error()}
		d.log.Warn("a backup outcome not recorded", "node", node, "module", clip(o.Module), "data", clip(o.Data), "err", err)
	} else {
		d.log.Info("backed up", "node", node, "module", o.Module, "data", o.Data, "kind", o.Kind, "ok", o.OK, "snapshot", o.Snapshot, "why", o.Why, "reason", o.Reason)
	}
	d.respondTo(m, node, reply)
	d.kick()
}
