package app

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"mesh-controller/app/archive"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/inventory"
	"mesh-controller/embedded/broker"
)

// archiveMesh is the embedded broker with JetStream on, trusting a
// migrated controller's operator, and a connection for each kind of user,
// each signed as the controller signs it.
type archiveMesh struct {
	srv  *broker.Server
	keys broker.Keys
}

func newArchiveMesh(t *testing.T) *archiveMesh {
	t.Helper()
	ctx := context.Background()
	_, st := migrated(t)
	keys, err := brokerKeys(ctx, st.Identity)
	if err != nil {
		t.Fatal(err)
	}
	trust, err := trustOf(ctx, st.Identity, keys, false)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := broker.StartWith(broker.Config{Listen: "127.0.0.1:0", Trust: trust, StoreDir: filepath.Join(t.TempDir(), "broker")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return &archiveMesh{srv: srv, keys: keys}
}

// user connects as a fresh user of the mesh account with p, as the
// controller makes its own and modules' users.
func (m *archiveMesh) user(t *testing.T, name string, p broker.Permissions, opts ...nats.Option) (*nats.Conn, violations) {
	t.Helper()
	userJWT, seed, err := m.keys.NewUser(name, p)
	if err != nil {
		t.Fatal(err)
	}
	return connectWith(t, m.srv.ClientURL(), append(opts, nats.UserJWTAndSeed(userJWT, string(seed)), nats.NoReconnect())...)
}

func (m *archiveMesh) controller(t *testing.T) (*nats.Conn, violations) {
	return m.user(t, "controller", controllerPermissions())
}

// host connects as node's host: its own nkey, signed at join with
// hostPermissions, and its inbox beneath its node's.
func (m *archiveMesh) host(t *testing.T, node string) (*nats.Conn, violations) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	userJWT, err := m.keys.IssueUser("host "+node, pub, hostPermissions(node), false)
	if err != nil {
		t.Fatal(err)
	}
	return connectWith(t, m.srv.ClientURL(), nats.UserJWTAndSeed(userJWT, string(seed)),
		nats.CustomInboxPrefix(protocol.HostInboxPrefix(node)), nats.NoReconnect())
}

// The JetStream subjects of the archives bucket, as nats.go's jetstream
// ObjectStore names them: its stream, its chunks' subjects and its metas'.
const (
	archiveStream = "OBJ_" + protocol.ArchiveBucket
	archiveChunks = "$O." + protocol.ArchiveBucket + ".C."
	archiveMeta   = "$O." + protocol.ArchiveBucket + ".M."
)

// builderInbox is the builder's inbox prefix on node, beneath its node's
// (as app/builder's BuilderInbox).
func builderInbox(node string) string { return protocol.BuilderInboxPrefix(node) }

// builderSeatPermissions are the builder module's on node: a module's user
// that holds the build seat, as the controller makes it.
func (m *archiveMesh) builderSeatPermissions(node string) broker.Permissions {
	return modulePermissions(inventory.Manifest{Module: "builder", Seats: []inventory.Seat{{Seat: buildSeat}}}, node)
}

// archiveServer is the controller's archive.Server on a connection of the
// controller's own, answering what the test says is declared and asked.
type archiveServer struct {
	*archive.Server
	mu       sync.Mutex
	declared map[string]bool // node/digest
	asked    map[string]bool // node/build id
	refused  []string
}

// serve starts the controller's side: the bucket, and a Server answering
// reads and uploads as the daemon does.
func (m *archiveMesh) serve(t *testing.T) (*archiveServer, *nats.Conn) {
	t.Helper()
	ctl, _ := m.controller(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := archive.EnsureBucket(ctx, ctl, 1); err != nil {
		t.Fatal(err)
	}
	a := &archiveServer{declared: map[string]bool{}, asked: map[string]bool{}}
	a.Server = archive.NewServer(ctl, archive.ServerOptions{CacheDir: t.TempDir(),
		Declared: func(_ context.Context, node, digest string) (bool, error) {
			a.mu.Lock()
			defer a.mu.Unlock()
			return a.declared[node+"/"+digest], nil
		},
		Asked: func(_ context.Context, node, id string) error {
			a.mu.Lock()
			defer a.mu.Unlock()
			if !a.asked[node+"/"+id] {
				return fmt.Errorf("build %s on %s: %w", id, node, archive.ErrNotAsked)
			}
			return nil
		},
		Refused: func(node, reason string) { a.mu.Lock(); a.refused = append(a.refused, node+": "+reason); a.mu.Unlock() },
	})
	a.Start(ctx)
	for subject, h := range map[string]nats.MsgHandler{protocol.NodeWildcard(protocol.ArchiveRead): a.OnRead, protocol.ArchiveUploadSubject("*"): a.OnUpload} {
		if _, err := ctl.Subscribe(subject, h); err != nil {
			t.Fatal(err)
		}
	}
	if err := ctl.Flush(); err != nil {
		t.Fatal(err)
	}
	return a, ctl
}

// allow says node's declaration names digest, and that build id is in
// flight on builder.
func (a *archiveServer) allow(node, digest, builder, id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if node != "" {
		a.declared[node+"/"+digest] = true
	}
	if builder != "" {
		a.asked[builder+"/"+id] = true
	}
}

// fetch reads an archive as the host of node does.
func fetch(ctx context.Context, nc *nats.Conn, node, digest string, w io.Writer) (int64, error) {
	return archive.Fetch(ctx, nc, protocol.NodeSubject(node, protocol.ArchiveRead), digest, w)
}

// upload hands over an archive as the builder on node does, for build id.
func upload(ctx context.Context, nc *nats.Conn, node, id, digest string, size int64, r io.Reader) error {
	return archive.Upload(ctx, nc, protocol.ArchiveUploadSubject(node), id, digest, size, r)
}

// builder connects as the builder module on node.
func (m *archiveMesh) builder(t *testing.T, node string) (*nats.Conn, violations) {
	return m.user(t, "module builder on "+node, m.builderSeatPermissions(node), nats.CustomInboxPrefix(builderInbox(node)))
}

// userCreds makes a user of the mesh account with p: its JWT and seed.
func (m *archiveMesh) userCreds(t *testing.T, name string, p broker.Permissions) [2]string {
	t.Helper()
	userJWT, seed, err := m.keys.NewUser(name, p)
	if err != nil {
		t.Fatal(err)
	}
	return [2]string{userJWT, string(seed)}
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// module connects as a module without the build seat.
func (m *archiveMesh) module(t *testing.T, module, node string) (*nats.Conn, violations) {
	return m.user(t, "module "+module+" on "+node, modulePermissions(inventory.Manifest{Module: module, Emits: []string{"x"}}, node))
}

// anonymous connects with no credentials, as a joining machine.
func (m *archiveMesh) anonymous(t *testing.T) (*nats.Conn, violations) {
	return connectWith(t, m.srv.ClientURL(), nats.CustomInboxPrefix(protocol.JoinInboxPrefix), nats.NoReconnect())
}

// randomFile writes size random bytes to a new file and returns its path
// and sha256.
func randomFile(t *testing.T, size int64) (string, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "archive.tar.zst")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	r := rand.NewChaCha8([32]byte{1})
	if _, err := io.CopyN(io.MultiWriter(f, h), r, size); err != nil {
		t.Fatal(err)
	}
	return path, hex.EncodeToString(h.Sum(nil))
}

// A fetch or a put is measured in a process of its own (this test binary,
// run again as TestArchives_Child), so that its heap is the client's alone,
// not the broker's beside it.
const childEnv = "MESH_TEST_ARCHIVE_CHILD"

// childFigures are what a child measured.
type childFigures struct {
	Bytes  int64   `json:"bytes"`
	Digest string  `json:"digest"`
	TookMS float64 `json:"took_ms"`
	// HeapRise is how far the heap in use rose above where it was before
	// (sampled every millisecond), RSSRise the resident set's peak above
	// where it was before.
	HeapRise int64 `json:"heap_rise"`
	// LiveRise is how far the live heap (what the last collection kept)
	// rose: what the client held, its garbage aside.
	LiveRise int64  `json:"live_rise"`
	RSSRise  int64  `json:"rss_rise"`
	Err      string `json:"err,omitempty"`
}

// child runs op (put or get) in a process of its own, as user (its JWT and
// seed) of node with inbox as its inbox prefix, and returns what it measured.
func child(t *testing.T, url string, user [2]string, node, inbox, op, digest, path string) childFigures {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestArchives_Child$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+op, "MESH_TEST_URL="+url, "MESH_TEST_JWT="+user[0], "MESH_TEST_SEED="+user[1],
		"MESH_TEST_NODE="+node, "MESH_TEST_INBOX="+inbox, "MESH_TEST_DIGEST="+digest, "MESH_TEST_PATH="+path)
	out, err := cmd.CombinedOutput()
	_, line, ok := strings.Cut(string(out), "FIGURES ")
	var f childFigures
	if !ok || json.Unmarshal([]byte(strings.SplitN(line, "\n", 2)[0]), &f) != nil {
		t.Fatalf("%s: %v\n%s", op, err, out)
	}
	if f.Err != "" {
		t.Fatalf("%s: %s", op, f.Err)
	}
	return f
}

// TestArchives_Child is a put or a fetch run by child.
func TestArchives_Child(t *testing.T) {
	op := os.Getenv(childEnv)
	if op == "" {
		t.Skip("run by TestArchives_PutAndGet")
	}
	var f childFigures
	defer func() { b, _ := json.Marshal(f); fmt.Printf("FIGURES %s\n", b) }()
	nc, err := nats.Connect(os.Getenv("MESH_TEST_URL"), nats.UserJWTAndSeed(os.Getenv("MESH_TEST_JWT"), os.Getenv("MESH_TEST_SEED")),
		nats.CustomInboxPrefix(os.Getenv("MESH_TEST_INBOX")), nats.NoReconnect())
	if err != nil {
		f.Err = err.Error()
		return
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	digest := os.Getenv("MESH_TEST_DIGEST")
	// Warm up (the connection) before measuring.
	if err := nc.Flush(); err != nil {
		f.Err = err.Error()
		return
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heapBefore, liveBefore, rssBefore := int64(ms.HeapInuse), int64(ms.HeapAlloc), procStatus("VmRSS")
	var peak, peakLive int64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		var ms runtime.MemStats
		live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		for {
			runtime.ReadMemStats(&ms)
			metrics.Read(live)
			peak = max(peak, int64(ms.HeapInuse))
			peakLive = max(peakLive, int64(live[0].Value.Uint64()))
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	start := time.Now()
	switch op {
	case "put":
		var file *os.File
		if file, err = os.Open(os.Getenv("MESH_TEST_PATH")); err == nil {
			fi, _ := file.Stat()
			err = upload(ctx, nc, os.Getenv("MESH_TEST_NODE"), "b-1-child", digest, fi.Size(), file)
			file.Close()
		}
	case "get":
		h := sha256.New()
		f.Bytes, err = fetch(ctx, nc, os.Getenv("MESH_TEST_NODE"), digest, h)
		f.Digest = hex.EncodeToString(h.Sum(nil))
	}
	f.TookMS = float64(time.Since(start).Microseconds()) / 1000
	close(stop)
	<-done
	if err != nil {
		f.Err = err.Error()
	}
	f.HeapRise, f.LiveRise, f.RSSRise = peak-heapBefore, peakLive-liveBefore, procStatus("VmHWM")-rssBefore
}

// procStatus is a size from /proc/self/status, in bytes.
func procStatus(field string) int64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// refused waits for the broker to refuse a publish or a subscription
// (what) on a subject that begins with subject, passing over other
// refusals; with what "", any refusal.
func refused(t *testing.T, v violations, what, subject string) {
	t.Helper()
	want := "Permissions Violation for " + what
	if what != "" {
		want += " to \"" + subject
	}
	var others []string
	deadline := time.After(5 * time.Second)
	for {
		select {
		case e := <-v:
			if strings.Contains(e, want) {
				return
			}
			others = append(others, e)
		case <-deadline:
			t.Fatalf("the broker allowed %s on %s (refused only %q)", what, subject, others)
		}
	}
}

// readsNothing fails the test if it is read.
type readsNothing struct{ t *testing.T }

func (r readsNothing) Read([]byte) (int, error) {
	r.t.Error("an upload read an archive the bucket holds already")
	return 0, io.EOF
}

// A builder hands the controller a 20 MB archive, streamed from its file,
// a piece at a time; a host reads it back, streamed, the same bytes: each
// through the controller's Server, neither touching JetStream.
func TestArchives_PutAndGet(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m := newArchiveMesh(t)
	srv, ctl := m.serve(t)
	if err := archive.EnsureBucket(ctx, ctl, 1); err != nil {
		t.Fatalf("again: %v", err)
	}
	if archive.BucketMaxBytes >= broker.MaxStore {
		t.Fatalf("the bucket's bound %d leaves no room under the account's %d", archive.BucketMaxBytes, broker.MaxStore)
	}
	js, _ := jetstream.New(ctl)
	if s, err := js.Stream(ctx, archiveStream); err != nil {
		t.Fatal(err)
	} else if c := s.CachedInfo().Config; c.Storage != jetstream.FileStorage || c.MaxBytes != archive.BucketMaxBytes ||
		c.Discard != jetstream.DiscardNew || c.AllowDirect || c.DenyPurge {
		t.Fatalf("the bucket's stream: %+v", c)
	}
	builder, builderRefused := m.builder(t, "build1")
	host, hostRefused := m.host(t, "web1")

	const size = 20 << 20
	path, digest := randomFile(t, size)
	srv.allow("web1", digest, "build1", "b-1-child")
	builderUser := m.userCreds(t, "module builder on build1", m.builderSeatPermissions("build1"))
	put := child(t, m.srv.ClientURL(), builderUser, "build1", builderInbox("build1"), "put", digest, path)
	t.Logf("put %d MiB from a file in %.0f ms; the builder's heap in use rose %.1f MiB, its live heap %.1f MiB, its resident set %.1f MiB",
		size>>20, put.TookMS, mib(put.HeapRise), mib(put.LiveRise), mib(put.RSSRise))
	hostUser := m.userCreds(t, "host web1", hostPermissions("web1"))
	got := child(t, m.srv.ClientURL(), hostUser, "web1", protocol.HostInboxPrefix("web1"), "get", digest, "")
	t.Logf("got %d MiB in %.0f ms; the host's heap in use rose %.1f MiB, its live heap %.1f MiB, its resident set %.1f MiB",
		got.Bytes>>20, got.TookMS, mib(got.HeapRise), mib(got.LiveRise), mib(got.RSSRise))
	if got.Bytes != size || got.Digest != digest {
		t.Fatalf("got %d bytes with sha256 %s", got.Bytes, got.Digest)
	}
	// Each side holds a piece or two at a time; the heap in use also
	// counts the pieces' garbage, which the collector takes back as it
	// goes, so it is logged, not judged.
	for _, f := range []childFigures{put, got} {
		if f.LiveRise > size/2 {
			t.Errorf("the live heap rose %.1f MiB for %d MiB: the archive was held, not streamed", mib(f.LiveRise), size>>20)
		}
	}

	t.Run("the controller reads it", func(t *testing.T) {
		h := sha256.New()
		if n, err := archive.Get(ctx, ctl, digest, h); err != nil || n != size || hex.EncodeToString(h.Sum(nil)) != digest {
			t.Fatalf("%d bytes: %v", n, err)
		}
	})
	t.Run("received and verified as a host does", func(t *testing.T) {
		pr, pw := io.Pipe()
		go func() {
			_, err := fetch(ctx, host, "web1", digest, pw)
			pw.CloseWithError(err)
		}()
		file, n, err := archive.Receive(pr, t.TempDir(), digest, protocol.MaxArchiveBytes)
		if err != nil || n != size {
			t.Fatalf("%d bytes: %v", n, err)
		}
		os.Remove(file)
	})
	t.Run("handed over again, nothing is read", func(t *testing.T) {
		srv.allow("", "", "build1", "b-2")
		if err := upload(ctx, builder, "build1", "b-2", digest, size, readsNothing{t}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("bytes that are not the digest are not named by it", func(t *testing.T) {
		other := strings.Repeat("ab", 32)
		srv.allow("web1", other, "build1", "b-3")
		err := upload(ctx, builder, "build1", "b-3", other, 3<<20, bytes.NewReader(make([]byte, 3<<20)))
		if !errors.Is(err, archive.ErrDigest) {
			t.Fatalf("upload: %v", err)
		}
		if _, err := fetch(ctx, host, "web1", other, io.Discard); !errors.Is(err, archive.ErrNotStored) {
			t.Fatalf("fetch: %v", err)
		}
	})
	t.Run("names that are not a digest", func(t *testing.T) {
		for _, name := range []string{"", "x", strings.ToUpper(digest), digest + "0", "../" + digest[3:]} {
			if err := upload(ctx, builder, "build1", "b-2", name, 1, strings.NewReader("x")); !errors.Is(err, archive.ErrNotDigest) {
				t.Errorf("upload %q: %v", name, err)
			}
			if _, err := fetch(ctx, host, "web1", name, io.Discard); !errors.Is(err, archive.ErrNotDigest) {
				t.Errorf("fetch %q: %v", name, err)
			}
		}
	})
	t.Run("an object whose meta names other bytes", func(t *testing.T) {
		// Written by hand (the controller may): no host takes it, and no
		// builder hands anything over it.
		store, _ := js.ObjectStore(ctx, protocol.ArchiveBucket)
		other := strings.Repeat("cd", 32)
		if _, err := store.PutBytes(ctx, other, []byte("not those bytes")); err != nil {
			t.Fatal(err)
		}
		srv.allow("web1", other, "build1", "b-4")
		if _, err := fetch(ctx, host, "web1", other, io.Discard); !errors.Is(err, archive.ErrMismatch) {
			t.Fatalf("fetch: %v", err)
		}
		if err := upload(ctx, builder, "build1", "b-4", other, 1, readsNothing{t}); !errors.Is(err, archive.ErrMismatch) {
			t.Fatalf("upload: %v", err)
		}
	})
	t.Run("a host reads only what is declared to it", func(t *testing.T) {
		web2, _ := m.host(t, "web2")
		if _, err := fetch(ctx, web2, "web2", digest, io.Discard); !errors.Is(err, archive.ErrNotDeclared) {
			t.Fatalf("an archive not declared to web2: %v", err)
		}
	})
	t.Run("a builder hands over only what a build it was asked for made", func(t *testing.T) {
		content := []byte("an archive no build made")
		sum := sha256.Sum256(content)
		for _, c := range []struct{ node, id string }{{"build1", "b-9-never-asked"}, {"build2", "b-2"}} {
			nc, _ := m.builder(t, c.node)
			if err := upload(ctx, nc, c.node, c.id, hex.EncodeToString(sum[:]), int64(len(content)), bytes.NewReader(content)); !errors.Is(err, archive.ErrNotAsked) {
				t.Errorf("%s handing over for %s: %v", c.node, c.id, err)
			}
		}
	})
	t.Run("answers go only to the asker's own inbox", func(t *testing.T) {
		web2, _ := m.host(t, "web2")
		sub, err := web2.SubscribeSync(protocol.HostInboxPrefix("web2") + ".stolen")
		if err != nil {
			t.Fatal(err)
		}
		web2.Flush()
		body, _ := json.Marshal(protocol.ArchiveReadRequest{Digest: digest})
		if err := host.PublishRequest(protocol.NodeSubject("web1", protocol.ArchiveRead), protocol.HostInboxPrefix("web2")+".stolen", body); err != nil {
			t.Fatal(err)
		}
		host.Flush()
		if m, err := sub.NextMsg(time.Second); err == nil {
			t.Fatalf("web1's read was answered into web2's inbox: %d bytes", len(m.Data))
		}
		srv.mu.Lock()
		defer srv.mu.Unlock()
		if len(srv.refused) == 0 {
			t.Fatal("the read answered elsewhere was not counted")
		}
	})
	select {
	case v := <-hostRefused:
		t.Fatalf("the host was refused: %s", v)
	case v := <-builderRefused:
		t.Fatalf("the builder was refused: %s", v)
	default:
	}
}

// jetStreamSubjects are every subject of the JetStream API (nats-server's
// jetstream_api.go), with the archives' stream, consumer and names filled
// in, and the subjects JetStream keeps or answers on.
func jetStreamSubjects(digest string) []string {
	s, c := archiveStream, "c"
	meta := archiveMeta + base64.URLEncoding.EncodeToString([]byte(digest))
	return []string{
		"$JS.API.INFO", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST",
		"$JS.API.STREAM.CREATE." + s, "$JS.API.STREAM.UPDATE." + s, "$JS.API.STREAM.INFO." + s, "$JS.API.STREAM.DELETE." + s,
		"$JS.API.STREAM.PURGE." + s, "$JS.API.STREAM.SNAPSHOT." + s, "$JS.API.STREAM.RESTORE." + s, "$JS.API.STREAM.MSG.DELETE." + s,
		"$JS.API.STREAM.MSG.GET." + s, "$JS.API.STREAM.LEADER.STEPDOWN." + s, "$JS.API.STREAM.PEER.REMOVE." + s,
		"$JS.API.STREAM.PEER.EVACUATE." + s, "$JS.API.STREAM.CANCEL_MOVE." + s,
		"$JS.API.DIRECT.GET." + s, "$JS.API.DIRECT.GET." + s + "." + meta, "$JS.API.DIRECT.GET",
		"$JS.API.CONSUMER.CREATE." + s, "$JS.API.CONSUMER.CREATE." + s + "." + c + "." + archiveChunks + "x",
		"$JS.API.CONSUMER.DURABLE.CREATE." + s + "." + c, "$JS.API.CONSUMER.NAMES." + s, "$JS.API.CONSUMER.LIST." + s,
		"$JS.API.CONSUMER.INFO." + s + "." + c, "$JS.API.CONSUMER.DELETE." + s + "." + c, "$JS.API.CONSUMER.PAUSE." + s + "." + c,
		"$JS.API.CONSUMER.UNPIN." + s + "." + c, "$JS.API.CONSUMER.MSG.NEXT." + s + "." + c,
		"$JS.API.CONSUMER.LEADER.STEPDOWN." + s + "." + c, "$JS.API.CONSUMER.PEER.REMOVE." + s + "." + c,
		"$JS.API.CONSUMER.PEER.EVACUATE." + s + "." + c,
		"$JS.API.META.LEADER.STEPDOWN", "$JS.API.META.RESCUE", "$JS.API.SERVER.REMOVE", "$JS.API.SERVER.EVACUATE",
		"$JS.API.ACCOUNT.PURGE.mesh", "$JS.API.ACCOUNT.STREAM.MOVE." + s + ".x", "$JS.API.ACCOUNT.STREAM.CANCEL_MOVE." + s + ".x",
		meta, archiveChunks + "x", "$O.other.C.x", "$KV.x.y", "$JS.ACK." + s + "." + c + ".1.1.1.1.0", "$JS.FC." + s + ".x.y",
		"$JS.EVENT.ADVISORY.API", "$JSC.R.x",
	}
}

// No user but the controller's has any of the JetStream API, so none can
// make the broker publish for it (a push consumer delivering stored bytes
// into another host's inbox, a pull or an API answer to any reply
// subject), purge or roll up the archives, or mark one deleted: every
// JetStream subject is a permission violation for a host, a builder, a
// module and a connection without credentials, refused by the live broker,
// and the archive is whole after.
func TestArchives_Permissions(t *testing.T) {
	ctx := context.Background()
	m := newArchiveMesh(t)
	srv, ctl := m.serve(t)
	content := bytes.Repeat([]byte("archive "), 40<<10) // three chunks
	sum := sha256.Sum256(content)
	digest := hex.EncodeToString(sum[:])
	srv.allow("web2", digest, "build1", "b-1")
	builder, _ := m.builder(t, "build1")
	if err := upload(ctx, builder, "build1", "b-1", digest, int64(len(content)), bytes.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	// A refused request is never answered: each waits this long.
	short := func(t *testing.T) context.Context {
		c, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		t.Cleanup(cancel)
		return c
	}
	stillThere := func(t *testing.T) {
		t.Helper()
		h := sha256.New()
		if _, err := archive.Get(ctx, ctl, digest, h); err != nil || hex.EncodeToString(h.Sum(nil)) != digest {
			t.Fatalf("the archive is no longer whole: %v", err)
		}
		host, _ := m.host(t, "web2")
		if _, err := fetch(ctx, host, "web2", digest, io.Discard); err != nil {
			t.Fatalf("web2 cannot read it: %v", err)
		}
	}
	for _, who := range []struct {
		name    string
		connect func(t *testing.T) (*nats.Conn, violations)
	}{
		{"a host", func(t *testing.T) (*nats.Conn, violations) { return m.host(t, "web1") }},
		{"a builder", func(t *testing.T) (*nats.Conn, violations) { return m.builder(t, "build2") }},
		{"a module without the build seat", func(t *testing.T) (*nats.Conn, violations) { return m.module(t, "web", "web1") }},
		{"a connection without credentials", m.anonymous},
	} {
		t.Run(who.name, func(t *testing.T) {
			nc, v := who.connect(t)
			for _, subject := range jetStreamSubjects(digest) {
				msg := nats.NewMsg(subject)
				msg.Header.Set("Nats-Rollup", "all") // what purged the bucket once
				msg.Data = []byte("{}")
				nc.PublishMsg(msg)
				nc.Flush()
				refused(t, v, "Publish", subject)
			}
			// The attacks of before, through nats.go as an attacker would
			// use it: each is refused by the broker.
			js, _ := jetstream.New(nc)
			if _, err := js.ObjectStore(short(t), protocol.ArchiveBucket); err == nil {
				t.Fatal("it looked the bucket up")
			}
			refused(t, v, "Publish", "$JS.API.STREAM.INFO."+archiveStream)
			if _, err := js.CreateConsumer(short(t), archiveStream, jetstream.ConsumerConfig{
				FilterSubject: archiveChunks + ">", AckPolicy: jetstream.AckNonePolicy}); err == nil {
				t.Fatal("it made a consumer of the archives")
			}
			refused(t, v, "Publish", "$JS.API.CONSUMER.CREATE."+archiveStream)
			if _, err := archive.Get(short(t), nc, digest, io.Discard); err == nil {
				t.Fatal("it read an archive from the bucket")
			}
			refused(t, v, "Publish", "$JS.API.STREAM.INFO."+archiveStream)
			if err := archive.Delete(short(t), nc, digest); err == nil {
				t.Fatal("it deleted an archive")
			}
			refused(t, v, "Publish", "$JS.API.STREAM.INFO."+archiveStream)
		})
	}
	stillThere(t)
}
