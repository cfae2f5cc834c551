package host

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"mesh-controller/app/archive"
	"mesh-controller/app/protocol"
)

// A host applying a declaration whose archive comes slowly keeps beating,
// and its beats say what it applies, since when and in which phase: the
// controller's archive server (the real one, on the bucket in the real
// broker's JetStream) lets a piece go only once it heard a beat saying
// so, so the archive cannot arrive unless the host beats while it fetches
// (a host that beats on the goroutine that applies never finishes). Two
// declarations pushed meanwhile: the older is superseded and never
// applied, the newer applied after. Once done, the beats say nothing of
// applying, and the archive is unpacked.
func TestRunner_BeatsWhileApplying(t *testing.T) {
	const heartbeat = 100 * time.Millisecond
	m := newLiveMesh(t, true)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := archive.EnsureBucket(ctx, m.ctl, 1); err != nil {
		t.Fatal(err)
	}
	// 9 MiB that do not compress: five pieces.
	noise := make([]byte, 9<<20)
	rand.Read(noise)
	file, a := packed(t, map[string]string{"lib/noise": string(noise), "mesh.json": `{"module":"big","version":"1.0.0"}`})
	pieces := int((a.Bytes + protocol.ArchiveReadPiece - 1) / protocol.ArchiveReadPiece)
	if pieces < 3 {
		t.Fatalf("the archive is %d bytes: %d pieces", a.Bytes, pieces)
	}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := archive.Put(ctx, m.ctl, a.Digest, f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	srv := archive.NewServer(m.ctl, archive.ServerOptions{CacheDir: t.TempDir(),
		Declared: func(_ context.Context, node, digest string) (bool, error) {
			return node == "n1" && digest == a.Digest, nil
		}})
	srv.Start(ctx)
	// Each read waits for a token, given one per beat heard saying the
	// apply is under way.
	tokens := make(chan struct{})
	var asked atomic.Int64
	if _, err := m.ctl.Subscribe(protocol.NodeSubject("n1", protocol.ArchiveRead), func(msg *nats.Msg) {
		asked.Add(1)
		go func() {
			select {
			case <-tokens:
				srv.OnRead(msg)
			case <-ctx.Done():
			}
		}()
	}); err != nil {
		t.Fatal(err)
	}
	beats, err := m.ctl.SubscribeSync(protocol.NodeSubject("n1", protocol.Heartbeat))
	if err != nil {
		t.Fatal(err)
	}
	m.run(&Runner{Heartbeat: heartbeat})
	beat := func() protocol.HeartbeatBody {
		t.Helper()
		msg, err := beats.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("no beat: %v; the host's log:\n%s", err, m.log.String())
		}
		var hb protocol.HeartbeatBody
		if err := m.opened(msg, &hb); err != nil {
			t.Fatal(err)
		}
		return hb
	}

	big := func() map[string]any {
		return map[string]any{"modules": []any{map[string]any{"module": "big", "version": "1.0.0",
			"archive": map[string]any{"digest": a.Digest, "bytes": a.Bytes, "unpacked_bytes": a.UnpackedBytes}}}}
	}
	first := m.push(big())
	// Heard applying, its fetch asked and held.
	var applying protocol.Applying
	deadline := time.Now().Add(10 * time.Second)
	for asked.Load() == 0 || applying.Serial == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("not heard applying declaration %d with its archive asked for (%d reads); the host's log:\n%s", first, asked.Load(), m.log.String())
		}
		if hb := beat(); hb.Applying != nil {
			applying = *hb.Applying
		}
	}
	if applying.Serial != first || applying.Since.IsZero() || time.Since(applying.Since) > time.Minute {
		t.Fatalf("the beat says applying %+v, want declaration %d since now", applying, first)
	}
	// Two more while it applies, of the same module: the first of them
	// superseded by the second.
	superseded := m.push(big())
	newest := m.push(big())
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if want := fmt.Sprintf("declaration %d superseded", superseded); !strings.Contains(m.log.String(), want) {
			return fmt.Errorf("the host's log does not say %q:\n%s", want, m.log.String())
		}
		return nil
	})

	// A piece let go per beat that says the apply is under way, until the
	// report comes; every one of them the same apply, fetching.
	given, applyingBeats := 0, 0
	var report protocol.AppliedBody
	for report.Serial == 0 {
		select {
		case report = <-m.reports:
			continue
		default:
		}
		hb := beat()
		if hb.Applying == nil {
			continue // sent before the apply began, or after it ended
		}
		if hb.SerialApplied >= first {
			// The first apply ended and the next began: its report is on
			// its way (a loaded machine hears the beat first).
			continue
		}
		applyingBeats++
		if hb.Applying.Serial != first || !hb.Applying.Since.Equal(applying.Since) || hb.SerialApplied != 0 {
			t.Fatalf("while applying %d since %s, a beat says %+v, applied %d", first, applying.Since, hb.Applying, hb.SerialApplied)
		}
		select {
		case tokens <- struct{}{}:
			given++
			if hb.Applying.Phase != "archives" {
				t.Fatalf("a beat while the archive is fetched says phase %q", hb.Applying.Phase)
			}
		default:
		}
	}
	if !report.OK || report.Serial != first {
		t.Fatalf("the first report: %+v", report)
	}
	if given < pieces || applyingBeats < pieces {
		t.Fatalf("%d pieces let go on %d beats saying applying, for %d pieces", given, applyingBeats, pieces)
	}
	t.Logf("%d pieces fetched over %d beats saying applying (%s)", given, applyingBeats, time.Since(applying.Since).Round(time.Millisecond))
	reads := asked.Load()
	if got := m.report(10 * time.Second); !got.OK || got.Serial != newest {
		t.Fatalf("after %d, the report of %+v; want %d, and %d superseded", first, got, newest, superseded)
	}
	b, err := os.ReadFile(filepath.Join(m.root, protocol.ModulesDir, "big", "1.0.0", "lib", "noise"))
	if err != nil || len(b) != len(noise) {
		t.Fatalf("the archive unpacked: %d bytes, %v", len(b), err)
	}
	if asked.Load() != reads {
		t.Fatalf("the archive unpacked already was read again: %d reads, then %d", reads, asked.Load())
	}
	// Done: the beats say what is applied, and nothing of applying.
	checkFor(t, 10*time.Second, time.Millisecond, func() error {
		if hb := beat(); hb.Applying != nil || hb.SerialApplied != newest {
			return fmt.Errorf("a beat after the applies says applying %+v, applied %d", hb.Applying, hb.SerialApplied)
		}
		return nil
	})
	select {
	case r := <-m.reports:
		t.Fatalf("a report of %d, superseded: %+v", superseded, r)
	default:
	}
}

// What waits for the worker: a declaration supersedes the older ones
// waiting; one older than one waiting, or that does not verify, waits its
// turn, to be refused and reported; past maxWaiting the oldest goes.
func TestApplyWork_Offer(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	_, forger, _ := ed25519.GenerateKey(rand.Reader)
	st := &State{Node: "web1", ControllerKey: pub}
	decl := func(key ed25519.PrivateKey, serial int) delivery {
		return delivery{env: sealed(t, key, map[string]any{"node": "web1", "serial": serial, "modules": []any{}})}
	}
	w := applyWork{wake: make(chan struct{}, 1)}
	serials := func() []int64 {
		var out []int64
		for _, dl := range w.waiting {
			out = append(out, dl.serial)
		}
		return out
	}
	if serial, superseded, letGo := w.offer(st, decl(priv, 5)); serial != 5 || superseded != nil || letGo != nil {
		t.Fatalf("the first: %d, %v, %v", serial, superseded, letGo)
	}
	w.offer(st, decl(priv, 3))   // older than one waiting: refused in its turn
	w.offer(st, decl(forger, 9)) // does not verify: refused in its turn
	if _, superseded, _ := w.offer(st, decl(priv, 5)); len(superseded) != 1 || superseded[0].serial != 3 || !slices.Equal(serials(), []int64{5, 0, 5}) {
		t.Fatalf("5 again: waiting %v, superseded %d", serials(), len(superseded))
	}
	if _, superseded, _ := w.offer(st, decl(priv, 7)); len(superseded) != 2 || !slices.Equal(serials(), []int64{0, 7}) {
		t.Fatalf("after 7: waiting %v, superseded %d", serials(), len(superseded))
	}
	for i := range maxWaiting - 2 { // full, with 0 and 7
		w.offer(st, decl(forger, 100+i))
	}
	if _, _, letGo := w.offer(st, decl(forger, 200)); letGo == nil || letGo.serial != 0 || len(w.waiting) != maxWaiting || w.waiting[0].serial != 7 {
		t.Fatalf("past the bound: let go %+v, waiting %v", letGo, serials())
	}
	if dl, ok := w.next(); !ok || dl.serial != 7 {
		t.Fatalf("next: %+v %v", dl, ok)
	}
}
