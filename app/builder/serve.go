package builder

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"mesh-controller/app/archive"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory/manifest"
)

// ServeOptions are what a builder module is given (its environment, as a
// host runs it).
type ServeOptions struct {
	// Broker is the broker's URL(s); Creds the builder's .creds file.
	Broker, Creds string
	// Node is the node it runs on: it takes the asks addressed there.
	Node string
	// WorkDir is its work data set.
	WorkDir string
	// Hide are its own paths no build may see (Builder.Hide).
	Hide []string
	// GitCredentials is the file of its git-credentials secret, read by
	// git when it exists (Builder.GitCredentials).
	GitCredentials string
	// Put hands the controller the archive file build id made, under its
	// digest (it stores it in the broker's object store, content-addressed).
	Put func(ctx context.Context, nc *nats.Conn, node, id, digest, file string) error
	// Log receives its log lines.
	Log io.Writer
}

// Serve takes the asks addressed to its node, one build at a time (an ask
// that arrives while it builds is answered not taken, and the controller
// asks again or elsewhere), reports each build's lines and its outcome,
// and stores each archive built, until ctx ends.
func Serve(ctx context.Context, o ServeOptions) error {
	if o.Log == nil {
		o.Log = io.Discard
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(o.Log, "%s mesh-builder %s: %s\n", time.Now().UTC().Format(time.RFC3339), o.Node, fmt.Sprintf(format, args...))
	}
	if !protocol.ValidName(o.Node) {
		return fmt.Errorf("node %q is not a valid name: run me as a module (MESH_NODE) or give --node", o.Node)
	}
	// Its answers come to an inbox beneath its node's, the only one its
	// broker user may read.
	nc, err := nats.Connect(o.Broker, nats.UserCredentials(o.Creds), nats.Name("mesh-builder "+o.Node), nats.CustomInboxPrefix(BuilderInbox(o.Node)),
		nats.MaxReconnects(-1), nats.ReconnectWait(time.Second))
	if err != nil {
		return fmt.Errorf("connect to %s: %w", o.Broker, err)
	}
	defer nc.Close()

	var mu sync.Mutex
	var busy string // the build in flight
	var cancel context.CancelCauseFunc
	b := &Builder{WorkDir: o.WorkDir, Node: o.Node, Hide: o.Hide, GitCredentials: o.GitCredentials, Progress: func(id, line string) {
		if msg, err := json.Marshal(protocol.BuildLine{ID: id, Line: line}); err == nil {
			_ = nc.Publish(protocol.BuildProgressSubject(o.Node), msg)
		}
	}}
	var wg sync.WaitGroup
	defer wg.Wait()
	if _, err := nc.Subscribe(protocol.BuildAskSubject(o.Node), func(m *nats.Msg) {
		var a Ask
		if err := json.Unmarshal(m.Data, &a); err != nil || a.ID == "" || a.Repository == "" {
			respond(m, protocol.BuildTaken{Why: "an ask names an id and a repository"})
			return
		}
		mu.Lock()
		if busy != "" {
			why := "busy with " + busy
			mu.Unlock()
			respond(m, protocol.BuildTaken{Why: why})
			return
		}
		bctx, c := context.WithCancelCause(ctx)
		busy, cancel = a.ID, c
		mu.Unlock()
		respond(m, protocol.BuildTaken{Taken: true})
		logf("took %s: %s at %q", a.ID, manifest.RedactRepository(a.Repository), a.Ref)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { mu.Lock(); busy, cancel = "", nil; mu.Unlock(); c(nil) }()
			report(ctx, nc, o.Node, build(bctx, b, a, nc, o), logf)
		}()
	}); err != nil {
		return err
	}
	if _, err := nc.Subscribe(protocol.BuildKillSubject(o.Node), func(m *nats.Msg) {
		var k protocol.BuildKill
		if json.Unmarshal(m.Data, &k) != nil {
			return
		}
		mu.Lock()
		if busy == k.ID && cancel != nil {
			cancel(errors.New("killed by hand"))
			logf("killing %s", k.ID)
		}
		mu.Unlock()
	}); err != nil {
		return err
	}
	if err := nc.Flush(); err != nil {
		return fmt.Errorf("the broker did not take my subscriptions: %w", err)
	}
	logf("taking asks on %s", protocol.BuildAskSubject(o.Node))
	<-ctx.Done()
	mu.Lock()
	if cancel != nil {
		cancel(errors.New("the builder stopped"))
	}
	mu.Unlock()
	return nil
}

// build runs one ask, its archive written to a file in the work dir and,
// once whole, stored under its digest.
func build(ctx context.Context, b *Builder, a Ask, nc *nats.Conn, o ServeOptions) Outcome {
	file := filepath.Join(o.WorkDir, "."+a.ID+".tar.zst")
	defer os.Remove(file)
	bb := *b
	bb.ArchiveTo = func(string) (io.WriteCloser, error) {
		return os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	}
	out := bb.Build(ctx, a)
	if out.Failed || out.DryRun || o.Put == nil {
		return out
	}
	if err := putPatiently(ctx, func() error { return o.Put(ctx, nc, o.Node, a.ID, out.Digest, file) }); err != nil {
		out.Failed, out.Why = true, "store the archive: "+err.Error()
	}
	return out
}

// putPatiently stores an archive, trying again for a minute while the
// broker cannot take it (a controller starting again, say): a build that
// succeeded is not failed by a broker that was away for a few seconds.
// What can never be stored (bytes not of their digest, too many, another
// object under that name, a file gone) is not tried again.
func putPatiently(ctx context.Context, put func() error) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := put()
		if err == nil || errors.Is(err, archive.ErrDigest) || errors.Is(err, archive.ErrTooLarge) || errors.Is(err, archive.ErrMismatch) ||
			errors.Is(err, archive.ErrNotDigest) || errors.Is(err, archive.ErrNotAsked) || errors.Is(err, fs.ErrNotExist) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Second):
		}
	}
}

// report sends an outcome until the controller says it recorded it (it may
// be starting again): a minute, then the ask's bound makes it ask again.
func report(ctx context.Context, nc *nats.Conn, node string, o Outcome, logf func(string, ...any)) {
	msg, err := json.Marshal(o)
	if err != nil {
		return
	}
	deadline := time.Now().Add(time.Minute)
	for {
		reply, err := nc.Request(protocol.BuildResultSubject(node), msg, protocol.AnswerTimeout)
		if err == nil {
			var ok protocol.OKReply
			if json.Unmarshal(reply.Data, &ok) == nil && ok.OK {
				logf("%s: reported %s", o.ID, map[bool]string{true: "failed: " + o.Why, false: "built " + o.Module + " " + o.Version}[o.Failed])
				return
			}
			if ok.Error != "" {
				// Heard and refused (killed or cancelled by hand, say):
				// reporting it again would change nothing.
				logf("%s: the controller refused the outcome: %s", o.ID, ok.Error)
				return
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			logf("%s: the outcome could not be reported: %v", o.ID, err)
			return
		}
		time.Sleep(time.Second)
	}
}

func respond(m *nats.Msg, v any) {
	if b, err := json.Marshal(v); err == nil {
		_ = m.Respond(b)
	}
}

// PutArchive hands the controller the archive file build id made on
// node (archive.Upload: one stored already is not sent, and the
// controller checks the bytes against the digest as they come).
func PutArchive(ctx context.Context, nc *nats.Conn, node, id, digest, file string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	return archive.Upload(ctx, nc, protocol.ArchiveUploadSubject(node), id, digest, fi.Size(), f)
}

// BuilderInbox is the inbox prefix of the builder on node: beneath the
// node's own (the host's), so no other node's user reads its answers.
func BuilderInbox(node string) string { return protocol.BuilderInboxPrefix(node) }
