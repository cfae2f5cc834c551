package archive

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"mesh-controller/app/protocol"
)

// Module archives are kept in the broker's JetStream object store, bucket
// protocol.ArchiveBucket, each named by its sha256 in hex (app/archive):
// builders write them, hosts and the controller read them, streamed in
// chunks on both sides, never held whole.

// BucketMaxBytes bounds the archives bucket (16 GiB): under the mesh
// account's JetStream bound (broker.MaxStore), leaving room for its other
// streams. Once it is full a put is refused; nothing is let go to make room.
const BucketMaxBytes int64 = 16 << 30

// putInFlight bounds the chunks of a put sent and not yet acknowledged
// (32 MiB: a quarter of the stream's ingest queue).
const putInFlight = 256

// chunkBytes is the size of an archive's chunks, each one message:
// nats.go's own default, well under a builder's largest message.
const chunkBytes = 128 << 10

// ErrNotStored means the bucket holds no archive of that digest.
var ErrNotStored = errors.New("archive not found: build the module again")

// ErrMismatch means the bucket holds an object under a digest whose
// own record (its meta) names other bytes: Put never stores one,
// nor puts over one; Get refuses it; the controller may let it go.
var ErrMismatch = errors.New("the object stored under that digest records other bytes")

// EnsureBucket makes the archives bucket if the broker has none, in
// files, bounded by BucketMaxBytes (a put past it is refused, never
// the oldest archives dropped), each archive kept by replicas servers of
// the broker (3 on a cluster, so that one server lost loses nothing; 1 on
// the embedded broker); one that exists is left as it is, but for being
// given more copies when the broker has grown into a cluster. serve calls
// it once it is connected.
//
// The bucket is nats.go's object store layout with one difference: its
// stream answers no direct get, so anyone may only read a stored message
// as a JetStream API answer (JSON, the message in base64), never have the
// server publish its raw bytes onto a subject the asker chose (app/broker.go).
func EnsureBucket(ctx context.Context, nc *nats.Conn, replicas int) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("make the archives bucket: %w", err)
	}
	b := protocol.ArchiveBucket
	// Looked up first: making it again, even alike, would be refused, its
	// bound counted twice against the account's.
	if _, err := js.ObjectStore(ctx, b); err == nil {
		return moreReplicas(ctx, js, replicas)
	} else if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return fmt.Errorf("the archives bucket %s: %w", b, err)
	}
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name:        streamName,
		Description: "module archives, each named by its sha256",
		Subjects:    []string{"$O." + protocol.ArchiveBucket + ".C.>", "$O." + protocol.ArchiveBucket + ".M.>"},
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
		MaxBytes:    BucketMaxBytes,
		// A chunk and its headers; a meta is far smaller.
		MaxMsgSize: chunkBytes + 4<<10,
		Discard:    jetstream.DiscardNew,
		// A meta replaces the one before it (nats.go publishes each with a
		// rollup header).
		AllowRollup: true,
		AllowDirect: false,
	})
	if err != nil {
		return fmt.Errorf("make the archives bucket %s: %w", b, err)
	}
	return nil
}

// moreReplicas gives the archives bucket replicas copies if it has fewer
// (a bucket made on one server, the broker since grown into a cluster):
// the servers copy what it holds to the new ones themselves.
func moreReplicas(ctx context.Context, js jetstream.JetStream, replicas int) error {
	stream, err := js.Stream(ctx, streamName)
	if err != nil {
		return fmt.Errorf("the archives bucket %s: %w", protocol.ArchiveBucket, err)
	}
	cfg := stream.CachedInfo().Config
	if cfg.Replicas >= replicas {
		return nil
	}
	cfg.Replicas = replicas
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("give the archives bucket %s %d copies: %w", protocol.ArchiveBucket, replicas, err)
	}
	return nil
}

// Bucket opens the archives bucket.
func Bucket(ctx context.Context, nc *nats.Conn, opts ...jetstream.JetStreamOpt) (jetstream.ObjectStore, error) {
	_, store, err := bucket(ctx, nc, opts...)
	return store, err
}

// bucket opens the archives bucket, with the JetStream context it opened
// it through (for what the object store does not do: consumers, the
// stream's chunk subjects).
func bucket(ctx context.Context, nc *nats.Conn, opts ...jetstream.JetStreamOpt) (jetstream.JetStream, jetstream.ObjectStore, error) {
	js, err := jetstream.New(nc, opts...)
	if err != nil {
		return nil, nil, err
	}
	store, err := js.ObjectStore(ctx, protocol.ArchiveBucket)
	if err != nil {
		return nil, nil, fmt.Errorf("the archives bucket %s: %w", protocol.ArchiveBucket, err)
	}
	return js, store, nil
}

// streamName is the stream nats.go keeps the archives bucket in.
const streamName = "OBJ_" + protocol.ArchiveBucket

// objectDigest is the sha256 (hex) of an object as its meta records it
// (nats.go's "SHA-256=<base64url>"), "" if it records none.
func objectDigest(info *jetstream.ObjectInfo) string {
	sum, err := jetstream.DecodeObjectDigest(info.Digest)
	if err != nil || len(sum) != sha256.Size {
		return ""
	}
	return hex.EncodeToString(sum)
}

// Put stores r under digest (the sha256 of its bytes, 64 lowercase
// hex), streamed a chunk at a time. If the bucket holds that archive
// already it does nothing and reads nothing from r: the same name is the
// same bytes. Bytes that do not have that digest, or more than
// protocol.MaxArchiveBytes of them, are refused before the archive is
// named (ErrDigest, ErrTooLarge); the chunks sent until
// then are left for the collection, since a builder may not purge.
// ErrMismatch if an object of that name is there that records other
// bytes.
func Put(ctx context.Context, nc *nats.Conn, digest string, r io.Reader) error {
	if !IsDigest(digest) {
		return fmt.Errorf("put archive %q: %w", digest, ErrNotDigest)
	}
	// Chunks are published without waiting for each acknowledgement, but
	// no more than putInFlight at once: nats.go allows 4,000 (500 MiB),
	// past the stream's ingest queue, which refuses the put with 429.
	store, err := Bucket(ctx, nc, jetstream.WithPublishAsyncMaxPending(putInFlight))
	if err != nil {
		return fmt.Errorf("put archive %s: %w", digest, err)
	}
	info, err := store.GetInfo(ctx, digest)
	switch {
	case err == nil && objectDigest(info) == digest:
		return nil
	case err == nil:
		return fmt.Errorf("put archive %s: %w", digest, ErrMismatch)
	case !errors.Is(err, jetstream.ErrObjectNotFound):
		return fmt.Errorf("put archive %s: look for it: %w", digest, err)
	}
	// On a refusal nats.go purges the chunks it sent, after waiting for
	// them to be stored: which a builder may not do, so it would wait for
	// the broker's answer until ctx ends. Ending the put's own context as
	// the refusal is made returns at once instead.
	putCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	v := &verifying{r: r, h: sha256.New(), want: digest, left: protocol.MaxArchiveBytes, refused: cancel}
	_, err = store.Put(putCtx, jetstream.ObjectMeta{Name: digest,
		Opts: &jetstream.ObjectMetaOptions{ChunkSize: chunkBytes}}, v)
	if v.err != nil {
		err = v.err
	}
	if err != nil {
		return fmt.Errorf("put archive %s: %w", digest, err)
	}
	return nil
}

// ErrNotDigest refuses a name that is not a sha256 in lowercase hex.
var ErrNotDigest = errors.New("not a sha256 in lowercase hex: archives are named by their digest")

// verifying passes r's bytes on while hashing them, and ends with an error
// instead of io.EOF if they are more than left or their sha256 is not
// want: nats.go's Put then returns without writing the object's meta, so
// no archive is ever named by a digest its bytes do not have.
type verifying struct {
	r       io.Reader
	h       hash.Hash
	want    string
	left    int64
	refused func()
	err     error
}

func (v *verifying) Read(p []byte) (int, error) {
	n, err := v.r.Read(p)
	v.h.Write(p[:n])
	v.left -= int64(n)
	switch {
	case v.left < 0:
		v.err = fmt.Errorf("more than %d bytes: %w", int64(protocol.MaxArchiveBytes), ErrTooLarge)
	case err == io.EOF:
		if got := hex.EncodeToString(v.h.Sum(nil)); got != v.want {
			v.err = fmt.Errorf("the bytes have sha256 %s: %w", got, ErrDigest)
		}
	case err != nil:
		v.err = fmt.Errorf("read the archive: %w", err)
	}
	if v.err != nil {
		v.refused()
		return n, v.err
	}
	return n, err
}

// Get streams the archive named digest into w and returns how many
// bytes it wrote. The object's meta must record digest as its sha256
// (ErrMismatch), and the bytes must have it and the meta's size (ErrDigest,
// once they are written: the caller verifies them again as it writes them,
// with Receive, before it uses them). ErrNotStored if there is none;
// ErrTooLarge, before a byte is written, if it is larger than
// protocol.MaxArchiveBytes.
//
// The chunks are pulled a bounded batch at a time (getBatch) from a
// consumer of this fetch's own, never pushed: nats.go's own object Get
// subscribes a push consumer that the broker keeps up to 32 MiB in flight
// for, per fetch, so a roll-out to many hosts at once held hundreds of MiB
// in the controller (README, "How fast").
func Get(ctx context.Context, nc *nats.Conn, digest string, w io.Writer) (int64, error) {
	if !IsDigest(digest) {
		return 0, fmt.Errorf("get archive %q: %w", digest, ErrNotDigest)
	}
	fail := func(err error) error { return fmt.Errorf("get archive %s: %w", digest, err) }
	js, store, err := bucket(ctx, nc)
	if err != nil {
		return 0, fail(err)
	}
	info, err := store.GetInfo(ctx, digest)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return 0, fail(ErrNotStored)
	}
	if err != nil {
		return 0, fail(err)
	}
	if objectDigest(info) != digest || info.NUID == "" {
		return 0, fail(ErrMismatch)
	}
	size := int64(info.Size)
	if size > protocol.MaxArchiveBytes {
		return 0, fail(fmt.Errorf("%d bytes: %w", size, ErrTooLarge))
	}
	if size == 0 {
		return 0, nil
	}
	cons, err := js.CreateConsumer(ctx, streamName, jetstream.ConsumerConfig{
		FilterSubject: chunkSubject(info.NUID),
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckNonePolicy,
		// Gone by itself if this host goes away mid-fetch.
		InactiveThreshold: time.Minute,
		MemoryStorage:     true,
	})
	if err != nil {
		return 0, fail(err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), protocol.AnswerTimeout)
		_ = js.DeleteConsumer(dctx, streamName, cons.CachedInfo().Name)
		cancel()
	}()
	h := sha256.New()
	var n int64
	var next uint64 = 1 // the consumer's sequence of the chunk expected next
	chunks := uint64(info.Chunks)
	for n < size {
		if err := ctx.Err(); err != nil {
			return n, fail(err)
		}
		// Exactly the chunks left, up to a batch: a pull that asks for
		// more than there are waits for its expiry.
		want := min(getBatch, max(chunks+1-next, 1))
		batch, err := cons.Fetch(int(want), jetstream.FetchMaxWait(getBatchWait))
		if err != nil {
			return n, fail(err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			meta, err := m.Metadata()
			if err != nil {
				return n, fail(err)
			}
			// No acknowledgements: a chunk lost on the way is a gap in
			// the consumer's sequence, and the fetch is refused whole.
			if meta.Sequence.Consumer != next {
				return n, fail(fmt.Errorf("chunk %d arrived where %d was due: fetch it again", meta.Sequence.Consumer, next))
			}
			next++
			data := m.Data()
			if n+int64(len(data)) > size {
				return n, fail(fmt.Errorf("more bytes than the %d its meta records: %w", size, ErrDigest))
			}
			if _, err := w.Write(data); err != nil {
				return n, fail(err)
			}
			h.Write(data)
			n += int64(len(data))
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return n, fail(err)
		}
		if got == 0 {
			return n, fail(fmt.Errorf("no chunk came within %s after %d of %d bytes", getBatchWait, n, size))
		}
	}
	if hex.EncodeToString(h.Sum(nil)) != digest {
		return n, fail(ErrDigest)
	}
	return n, nil
}

// A fetch pulls at most getBatch chunks at a time (2 MiB), waiting up to
// getBatchWait for each batch.
const (
	getBatch     = 16
	getBatchWait = 30 * time.Second
)

// Stored is an archive the bucket holds.
type Stored struct {
	Digest string
	Bytes  int64
	// StoredAt is when its put ended.
	StoredAt time.Time
}

// Leftover is what a put that never ended left in the bucket: chunks no
// archive names (a builder may not purge them; the controller's sweep
// does).
type Leftover struct {
	// Subject holds the chunks.
	Subject string
	Chunks  uint64
	// LastAt is when its last chunk was stored.
	LastAt time.Time
}

// List returns every archive the bucket holds, by digest, and the
// leftovers of puts that never ended.
func List(ctx context.Context, nc *nats.Conn) ([]Stored, []Leftover, error) {
	js, store, err := bucket(ctx, nc)
	if err != nil {
		return nil, nil, err
	}
	infos, err := store.List(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil, nil, fmt.Errorf("list archives: %w", err)
	}
	named := map[string]bool{}
	out := []Stored{}
	for _, info := range infos {
		named[chunkSubject(info.NUID)] = true
		out = append(out, Stored{Digest: info.Name, Bytes: int64(info.Size), StoredAt: info.ModTime.UTC()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Digest < out[j].Digest })
	stream, err := js.Stream(ctx, streamName)
	if err != nil {
		return nil, nil, fmt.Errorf("list archives: %w", err)
	}
	si, err := stream.Info(ctx, jetstream.WithSubjectFilter(chunkSubject(">")))
	if err != nil {
		return nil, nil, fmt.Errorf("list archives' chunks: %w", err)
	}
	var left []Leftover
	for subj, n := range si.State.Subjects {
		if named[subj] {
			continue
		}
		l := Leftover{Subject: subj, Chunks: n}
		// A put under way looks the same: its last chunk says how recent.
		if m, err := stream.GetLastMsgForSubject(ctx, subj); err == nil {
			l.LastAt = m.Time.UTC()
		}
		left = append(left, l)
	}
	sort.Slice(left, func(i, j int) bool { return left[i].Subject < left[j].Subject })
	return out, left, nil
}

// chunkSubject is where nats.go's object store keeps an object's chunks.
func chunkSubject(nuid string) string { return "$O." + protocol.ArchiveBucket + ".C." + nuid }

// Delete removes an archive from the bucket: its chunks go, a small
// marker that it was deleted stays (nats.go's object store).
func Delete(ctx context.Context, nc *nats.Conn, digest string) error {
	if !IsDigest(digest) {
		return fmt.Errorf("delete archive %q: %w", digest, ErrNotDigest)
	}
	store, err := Bucket(ctx, nc)
	if err != nil {
		return err
	}
	if err := store.Delete(ctx, digest); err != nil {
		return fmt.Errorf("delete archive %s: %w", digest, err)
	}
	return nil
}

// PurgeLeftover removes the chunks of a put that never ended.
func PurgeLeftover(ctx context.Context, nc *nats.Conn, subject string) error {
	if !strings.HasPrefix(subject, chunkSubject("")) {
		return fmt.Errorf("purge %q: not a chunk subject of the archives bucket", subject)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	stream, err := js.Stream(ctx, streamName)
	if err != nil {
		return err
	}
	if err := stream.Purge(ctx, jetstream.WithPurgeSubject(subject)); err != nil {
		return fmt.Errorf("purge %s: %w", subject, err)
	}
	return nil
}
