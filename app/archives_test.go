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

// builderInbox is the builder's inbox prefix on node, beneath its node's
// (as app/builder's BuilderInbox).
func builderInbox(node string) string { return protocol.HostInboxPrefix(node) + ".builder" }

// builderSeatPermissions are the builder module's on node: a module's user
// with the archive writes merged in, and its own inbox.
func (m *archiveMesh) builderSeatPermissions(node string) broker.Permissions {
	p := mergePermissions(modulePermissions(inventory.Manifest{Module: "builder"}, node), builderArchivePermissions())
	p.Subscribe = append(p.Subscribe, builderInbox(node)+".>")
	return p
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
// seed) with inbox as its inbox prefix, and returns what it measured.
func child(t *testing.T, url string, user [2]string, inbox, op, digest, path string) childFigures {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestArchives_Child$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+op, "MESH_TEST_URL="+url, "MESH_TEST_JWT="+user[0], "MESH_TEST_SEED="+user[1],
		"MESH_TEST_INBOX="+inbox, "MESH_TEST_DIGEST="+digest, "MESH_TEST_PATH="+path)
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
	// Warm up (the connection, the bucket's lookup) before measuring.
	if _, err := archive.Bucket(ctx, nc); err != nil {
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
			err = archive.Put(ctx, nc, digest, file)
			file.Close()
		}
	case "get":
		h := sha256.New()
		f.Bytes, err = archive.Get(ctx, nc, digest, h)
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
	r.t.Error("PutArchive read an archive the bucket holds already")
	return 0, io.EOF
}

// A builder puts a 20 MB archive, streamed from its file; a host reads it
// back, streamed, the same bytes.
func TestArchives_PutAndGet(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := newArchiveMesh(t)
	ctl, _ := m.controller(t)
	if err := archive.EnsureBucket(ctx, ctl, 1); err != nil {
		t.Fatal(err)
	}
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
	builderUser := m.userCreds(t, "module builder on build1", m.builderSeatPermissions("build1"))
	put := child(t, m.srv.ClientURL(), builderUser, builderInbox("build1"), "put", digest, path)
	t.Logf("put %d MiB from a file in %.0f ms; the builder's heap in use rose %.1f MiB, its live heap %.1f MiB, its resident set %.1f MiB",
		size>>20, put.TookMS, mib(put.HeapRise), mib(put.LiveRise), mib(put.RSSRise))
	hostUser := m.userCreds(t, "host web1", hostPermissions("web1"))
	got := child(t, m.srv.ClientURL(), hostUser, protocol.HostInboxPrefix("web1"), "get", digest, "")
	t.Logf("got %d MiB in %.0f ms; the host's heap in use rose %.1f MiB, its live heap %.1f MiB, its resident set %.1f MiB",
		got.Bytes>>20, got.TookMS, mib(got.HeapRise), mib(got.LiveRise), mib(got.RSSRise))
	if got.Bytes != size || got.Digest != digest {
		t.Fatalf("got %d bytes with sha256 %s", got.Bytes, got.Digest)
	}
	// A fetch holds at most the broker's flow-control window (about 4 MiB:
	// the server stops pushing until the client answers), a put a chunk
	// or two; the heap in use also counts the chunks' garbage, which the
	// collector takes back as it goes, so it is logged, not judged.
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
			_, err := archive.Get(ctx, host, digest, pw)
			pw.CloseWithError(err)
		}()
		file, n, err := archive.Receive(pr, t.TempDir(), digest, protocol.MaxArchiveBytes)
		if err != nil || n != size {
			t.Fatalf("%d bytes: %v", n, err)
		}
		os.Remove(file)
	})
	t.Run("put again, nothing is read", func(t *testing.T) {
		if err := archive.Put(ctx, builder, digest, readsNothing{t}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("bytes that are not the digest are not named by it", func(t *testing.T) {
		other := strings.Repeat("ab", 32)
		start := time.Now()
		err := archive.Put(ctx, builder, other, bytes.NewReader(make([]byte, 300<<10)))
		if !errors.Is(err, archive.ErrDigest) {
			t.Fatalf("put: %v", err)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("the refusal took %v", took)
		}
		if _, err := archive.Get(ctx, host, other, io.Discard); !errors.Is(err, archive.ErrNotStored) {
			t.Fatalf("get: %v", err)
		}
		// The chunks sent are left: the builder may not purge them, and
		// did not try.
		select {
		case v := <-builderRefused:
			t.Fatalf("refused: %s", v)
		default:
		}
	})
	t.Run("names that are not a digest", func(t *testing.T) {
		for _, name := range []string{"", "x", strings.ToUpper(digest), digest + "0", "../" + digest[3:]} {
			if err := archive.Put(ctx, builder, name, strings.NewReader("x")); !errors.Is(err, archive.ErrNotDigest) {
				t.Errorf("put %q: %v", name, err)
			}
			if _, err := archive.Get(ctx, host, name, io.Discard); !errors.Is(err, archive.ErrNotDigest) {
				t.Errorf("get %q: %v", name, err)
			}
		}
	})
	t.Run("an object whose meta names other bytes", func(t *testing.T) {
		// Written by hand (the controller may): no host takes it, and a
		// builder does not put over it.
		store, _ := js.ObjectStore(ctx, protocol.ArchiveBucket)
		other := strings.Repeat("cd", 32)
		if _, err := store.PutBytes(ctx, other, []byte("not those bytes")); err != nil {
			t.Fatal(err)
		}
		if _, err := archive.Get(ctx, host, other, io.Discard); !errors.Is(err, archive.ErrMismatch) {
			t.Fatalf("get: %v", err)
		}
		if err := archive.Put(ctx, builder, other, readsNothing{t}); !errors.Is(err, archive.ErrMismatch) {
			t.Fatalf("put: %v", err)
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

// What each kind of user may not do to the archives, refused by the live
// broker.
func TestArchives_Permissions(t *testing.T) {
	ctx := context.Background()
	m := newArchiveMesh(t)
	ctl, _ := m.controller(t)
	if err := archive.EnsureBucket(ctx, ctl, 1); err != nil {
		t.Fatal(err)
	}
	builder, _ := m.builder(t, "build1")
	content := bytes.Repeat([]byte("archive "), 40<<10) // three chunks
	sum := sha256.Sum256(content)
	digest := hex.EncodeToString(sum[:])
	if err := archive.Put(ctx, builder, digest, bytes.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	metaSubject := archiveMeta + base64.URLEncoding.EncodeToString([]byte(digest)) // as nats.go names it
	// A refused request is never answered: each waits this long.
	short := func(t *testing.T) context.Context {
		c, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		t.Cleanup(cancel)
		return c
	}
	store := func(t *testing.T, nc *nats.Conn) jetstream.ObjectStore {
		t.Helper()
		js, _ := jetstream.New(nc)
		s, err := js.ObjectStore(ctx, protocol.ArchiveBucket)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	stillThere := func(t *testing.T) {
		t.Helper()
		host, _ := m.host(t, "web2")
		h := sha256.New()
		if _, err := archive.Get(ctx, host, digest, h); err != nil || hex.EncodeToString(h.Sum(nil)) != digest {
			t.Fatalf("the archive is no longer whole: %v", err)
		}
	}

	t.Run("a host puts an object", func(t *testing.T) {
		host, v := m.host(t, "web1")
		if _, err := store(t, host).PutBytes(short(t), "x", []byte("from a host")); err == nil {
			t.Fatal("a host put an object")
		}
		refused(t, v, "Publish", archiveChunks)
		raw := strings.Repeat("ef", 32)
		if err := archive.Put(short(t), host, raw, strings.NewReader("x")); err == nil {
			t.Fatal("a host put an archive")
		}
		refused(t, v, "Publish", archiveChunks)
	})
	t.Run("a host deletes an object", func(t *testing.T) {
		host, v := m.host(t, "web1")
		if err := store(t, host).Delete(short(t), digest); err == nil {
			t.Fatal("a host deleted an archive")
		}
		refused(t, v, "Publish", metaSubject)
		host.Publish("$JS.API.STREAM.PURGE."+archiveStream, nil)
		refused(t, v, "Publish", "$JS.API.STREAM.PURGE."+archiveStream)
		stillThere(t)
	})
	t.Run("a host makes a consumer of the metas", func(t *testing.T) {
		host, v := m.host(t, "web1")
		js, _ := jetstream.New(host)
		if _, err := js.OrderedConsumer(short(t), archiveStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{archiveMeta + ">"}}); err == nil {
			t.Fatal("a host made a consumer of the metas")
		}
		refused(t, v, "Publish", "$JS.API.CONSUMER.CREATE."+archiveStream)
	})
	t.Run("a builder purges the stream", func(t *testing.T) {
		builder, v := m.builder(t, "build2")
		js, _ := jetstream.New(builder)
		s, err := js.Stream(ctx, archiveStream)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Purge(short(t)); err == nil {
			t.Fatal("a builder purged the archives")
		}
		refused(t, v, "Publish", "$JS.API.STREAM.PURGE."+archiveStream)
		if err := js.DeleteStream(short(t), archiveStream); err == nil {
			t.Fatal("a builder deleted the archives' stream")
		}
		refused(t, v, "Publish", "$JS.API.STREAM.DELETE."+archiveStream)
		if _, err := js.UpdateStream(short(t), jetstream.StreamConfig{Name: archiveStream, Subjects: []string{"$O.>"}, MaxBytes: 1}); err == nil {
			t.Fatal("a builder changed the archives' stream")
		}
		refused(t, v, "Publish", "$JS.API.STREAM.UPDATE."+archiveStream)
		if err := s.DeleteMsg(short(t), 1); err == nil {
			t.Fatal("a builder deleted a chunk")
		}
		refused(t, v, "Publish", "$JS.API.STREAM.MSG.DELETE."+archiveStream)
		stillThere(t)
	})
	t.Run("a builder deletes an object", func(t *testing.T) {
		// It may write metas (a put ends with one), so its mark that the
		// object is deleted is taken: but the chunks, which it may not
		// purge, are kept, and putting the archive again (the same bytes
		// under the same name) brings it back.
		builder, v := m.builder(t, "build2")
		if err := store(t, builder).Delete(short(t), digest); err == nil {
			t.Fatal("a builder deleted an archive")
		}
		refused(t, v, "Publish", "$JS.API.STREAM.PURGE."+archiveStream)
		host, _ := m.host(t, "web2")
		if _, err := archive.Get(ctx, host, digest, io.Discard); !errors.Is(err, archive.ErrNotStored) {
			t.Fatalf("the mark was not taken (%v): the note above may go", err)
		}
		if err := archive.Put(ctx, builder, digest, bytes.NewReader(content)); err != nil {
			t.Fatal(err)
		}
		stillThere(t)
	})
	for _, who := range []struct {
		name    string
		connect func(t *testing.T) (*nats.Conn, violations)
	}{
		{"a connection without credentials", m.anonymous},
		{"a module without the build seat", func(t *testing.T) (*nats.Conn, violations) { return m.module(t, "web", "web1") }},
	} {
		t.Run(who.name+" touches the archives", func(t *testing.T) {
			nc, v := who.connect(t)
			js, _ := jetstream.New(nc)
			if _, err := js.ObjectStore(short(t), protocol.ArchiveBucket); err == nil {
				t.Fatal("it looked the bucket up")
			}
			refused(t, v, "", "")
			if _, err := archive.Get(short(t), nc, digest, io.Discard); err == nil {
				t.Fatal("it read an archive")
			}
			refused(t, v, "", "")
			for _, subject := range []string{"$JS.API.INFO", metaSubject, archiveChunks + "x", "$JS.API.STREAM.PURGE." + archiveStream} {
				nc.Publish(subject, []byte("{}"))
				refused(t, v, "Publish", subject)
			}
		})
	}
	stillThere(t)
}
