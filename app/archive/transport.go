package archive

// How archives cross the broker (app/protocol's archive.go): the
// controller alone uses the JetStream API; a host reads an archive
// declared to it a piece at a time through the Server, and a builder
// hands the Server the pieces of the archive its build made, which the
// Server stores (Put) unless it holds one of that digest already.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"mesh-controller/app/protocol"
)

// ErrNotDeclared refuses a host a read of an archive its declaration does
// not name.
var ErrNotDeclared = errors.New("the archive is not declared to this node")

// ErrNotAsked refuses a builder an upload for a build it was not asked for
// (or no longer is: killed, timed out, reported).
var ErrNotAsked = errors.New("no build of that id is in flight on this builder")

// The codes an answer's error begins with, so that each side tells the
// others' refusals apart as sentinels.
var errorCodes = []struct {
	code string
	err  error
}{
	{"not-stored", ErrNotStored},
	{"mismatch", ErrMismatch},
	{"digest", ErrDigest},
	{"too-large", ErrTooLarge},
	{"not-digest", ErrNotDigest},
	{"not-declared", ErrNotDeclared},
	{"not-asked", ErrNotAsked},
}

// coded writes err for the wire: its code, then its words.
func coded(err error) string {
	for _, c := range errorCodes {
		if errors.Is(err, c.err) {
			return c.code + ": " + err.Error()
		}
	}
	return err.Error()
}

// uncoded is the error a coded answer names.
func uncoded(s string) error {
	for _, c := range errorCodes {
		if rest, ok := strings.CutPrefix(s, c.code+": "); ok {
			return fmt.Errorf("the controller refused: %s: %w", strings.TrimSuffix(rest, ": "+c.err.Error()), c.err)
		}
	}
	return errors.New("the controller refused: " + s)
}

// ServerOptions are what a Server asks the rest of the controller.
type ServerOptions struct {
	// Declared says whether node's latest declaration names the archive.
	Declared func(ctx context.Context, node, digest string) (bool, error)
	// Asked returns nil if the build id is in flight on builder node.
	Asked func(ctx context.Context, node, id string) error
	// Refused is told of each request refused without an answer (its reply
	// subject was not the asker's own), for counting; may be nil.
	Refused func(node, reason string)
	// Workers is how many reads are served at once (default 8).
	Workers int
	// CacheDir is where the archives hosts read are copied from the bucket
	// (at most maxCached of them), emptied when the Server stops.
	CacheDir string
}

// Bounds of what a Server holds.
const (
	// readQueue is how many reads may wait for a worker; past it a read is
	// answered busy and its host asks again.
	readQueue = 256
	// maxCached is how many archives the cache dir keeps copies of: a
	// roll-out's, and the last few before it.
	maxCached = 4
	// uploadsPerBuilder and maxUploads bound the uploads under way.
	uploadsPerBuilder = 2
	maxUploads        = 16
	// uploadIdle ends an upload whose builder sent nothing for that long.
	uploadIdle = 2 * time.Minute
	// grantFor is how long a read allowed stays allowed without asking
	// Declared again.
	grantFor = 10 * time.Minute
	// lastPieceWait bounds the answer to an upload's last piece: the put's
	// last chunks are acknowledged first.
	lastPieceWait = 30 * time.Second
)

// Server serves archives to hosts and takes them from builders, over the
// controller's own connection.
type Server struct {
	nc    *nats.Conn
	o     ServerOptions
	reads chan *nats.Msg

	mu      sync.Mutex
	cache   map[string]*cached
	grants  map[[2]string]time.Time
	uploads map[string]*upload // by builder/digest
}

// NewServer makes a Server on nc; Start starts its workers.
func NewServer(nc *nats.Conn, o ServerOptions) *Server {
	if o.Workers <= 0 {
		o.Workers = 8
	}
	return &Server{nc: nc, o: o, reads: make(chan *nats.Msg, readQueue),
		cache: map[string]*cached{}, grants: map[[2]string]time.Time{}, uploads: map[string]*upload{}}
}

// Start runs the read workers and the upload janitor until ctx ends. What
// the cache dir holds from before (a controller killed) is removed first:
// only what this Server copied is served.
func (s *Server) Start(ctx context.Context) {
	if des, err := os.ReadDir(s.o.CacheDir); err == nil {
		for _, de := range des {
			os.Remove(filepath.Join(s.o.CacheDir, de.Name()))
		}
	}
	for range s.o.Workers {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case m := <-s.reads:
					s.serveRead(ctx, m)
				}
			}
		}()
	}
	go func() {
		t := time.NewTicker(uploadIdle / 4)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				s.endUploads(errors.New("the controller stopped"))
				s.clearCache()
				return
			case <-t.C:
				s.endIdle(time.Now())
			}
		}
	}()
}

// refused drops a request whose reply subject is not its asker's own.
func (s *Server) refused(m *nats.Msg, node, prefix string) bool {
	if strings.HasPrefix(m.Reply, prefix) && len(m.Reply) > len(prefix) {
		return false
	}
	if s.o.Refused != nil {
		s.o.Refused(node, "answer outside its inbox")
	}
	return true
}

// OnRead takes a host's read (mesh.node.N.archive): queued for a worker,
// or answered busy when the queue is full.
func (s *Server) OnRead(m *nats.Msg) {
	node := protocol.NodeOfSubject(m.Subject)
	if !protocol.ValidName(node) || s.refused(m, node, protocol.HostInboxPrefix(node)+".") {
		return
	}
	select {
	case s.reads <- m:
	default:
		answerRead(m, nil, 0, 0, errors.New(protocol.ArchiveBusy))
	}
}

// serveRead answers one read.
func (s *Server) serveRead(ctx context.Context, m *nats.Msg) {
	node := protocol.NodeOfSubject(m.Subject)
	var req protocol.ArchiveReadRequest
	if err := json.Unmarshal(m.Data, &req); err != nil {
		answerRead(m, nil, 0, 0, fmt.Errorf("a read that is not JSON: %w", err))
		return
	}
	if !IsDigest(req.Digest) {
		answerRead(m, nil, 0, 0, fmt.Errorf("read %q: %w", req.Digest, ErrNotDigest))
		return
	}
	if err := s.grant(ctx, node, req.Digest); err != nil {
		answerRead(m, nil, 0, 0, err)
		return
	}
	data, size, err := s.piece(ctx, req.Digest, req.Offset)
	answerRead(m, data, size, req.Offset, err)
}

// answerRead answers a read with its piece, or its error.
func answerRead(m *nats.Msg, data []byte, size, offset int64, err error) {
	a := nats.NewMsg(m.Reply)
	if err != nil {
		a.Header.Set(protocol.ArchiveError, coded(err))
	} else {
		a.Header.Set(protocol.ArchiveSize, strconv.FormatInt(size, 10))
		a.Header.Set(protocol.ArchiveOffset, strconv.FormatInt(offset, 10))
		a.Data = data
	}
	_ = m.RespondMsg(a)
}

// grant checks node may read the archive: its declaration names it.
func (s *Server) grant(ctx context.Context, node, digest string) error {
	key := [2]string{node, digest}
	now := time.Now()
	s.mu.Lock()
	until, ok := s.grants[key]
	s.mu.Unlock()
	if ok && now.Before(until) {
		return nil
	}
	declared, err := s.o.Declared(ctx, node, digest)
	if err != nil {
		return fmt.Errorf("read its declaration: %w", err)
	}
	if !declared {
		return fmt.Errorf("archive %s, for %s: %w", short(digest), node, ErrNotDeclared)
	}
	s.mu.Lock()
	for k, u := range s.grants { // bounded by what is declared, and pruned as it goes
		if now.After(u) {
			delete(s.grants, k)
		}
	}
	s.grants[key] = now.Add(grantFor)
	s.mu.Unlock()
	return nil
}

// cached is one archive read from the bucket into a file of the cache
// dir, from which every host's pieces are read: the bucket is read once
// for however many hosts fetch it, and a piece is a file read, not four
// JetStream API round trips.
type cached struct {
	ready chan struct{}
	err   error
	path  string
	size  int64
	used  time.Time // s.mu guards it
	// readers counts the pieces being read from it: it is not removed
	// under them.
	readers int
	// failedAt is when its fill failed (err), zero if it did not.
	failedAt time.Time
}

// failed says a fill failed long enough ago to be tried again; s.mu is held.
func (c *cached) failed() bool {
	return !c.failedAt.IsZero() && time.Since(c.failedAt) > refillAfter
}

// fillWait is how long a read waits for its archive's copy before it is
// answered busy; refillAfter how long a failed fill is answered before the
// bucket is read again.
const (
	fillWait    = 2 * time.Second
	refillAfter = 5 * time.Second
)

// cachedFile finds the archive's cached copy, filling it (once, off the
// read's worker) if it has none: until it is whole, reads are answered
// busy and their hosts ask again.
func (s *Server) cachedFile(digest string) (*cached, error) {
	s.mu.Lock()
	c, ok := s.cache[digest]
	if ok && c.failed() {
		ok = false // read again
	}
	if !ok {
		c = &cached{ready: make(chan struct{}), path: filepath.Join(s.o.CacheDir, digest)}
		s.cache[digest] = c
		go s.fill(digest, c)
	}
	c.used = time.Now()
	s.mu.Unlock()
	// A small archive is whole in a moment: its first read waits for it.
	select {
	case <-c.ready:
	case <-time.After(fillWait):
		return nil, errBusy
	}
	if c.err != nil {
		return nil, c.err
	}
	return c, nil
}

// errBusy is a read the Server cannot answer yet.
var errBusy = errors.New(protocol.ArchiveBusy)

// fill reads the archive from the bucket into its cache file (verified
// against its digest by Get), then makes room by forgetting the least
// recently used copies beyond maxCached.
func (s *Server) fill(digest string, c *cached) {
	defer close(c.ready)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute+time.Duration(protocol.MaxArchiveBytes/10_000_000)*time.Second)
	defer cancel()
	c.err = func() error {
		if err := os.MkdirAll(s.o.CacheDir, 0o700); err != nil {
			return err
		}
		f, err := os.CreateTemp(s.o.CacheDir, "."+digest+"-*")
		if err != nil {
			return err
		}
		defer os.Remove(f.Name())
		n, err := Get(ctx, s.nc, digest, f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		c.size = n
		return os.Rename(f.Name(), c.path)
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.err != nil {
		c.failedAt = time.Now() // answered for a while, then read again
		return
	}
	for len(s.cache) > maxCached {
		oldest := ""
		for d, o := range s.cache {
			select {
			case <-o.ready:
			default:
				continue // being filled
			}
			if d != digest && o.readers == 0 && (oldest == "" || o.used.Before(s.cache[oldest].used)) {
				oldest = d
			}
		}
		if oldest == "" {
			return
		}
		os.Remove(s.cache[oldest].path)
		delete(s.cache, oldest)
	}
}

// piece reads up to protocol.ArchiveReadPiece bytes of the archive from offset.
func (s *Server) piece(ctx context.Context, digest string, offset int64) ([]byte, int64, error) {
	c, err := s.cachedFile(digest)
	if err != nil {
		return nil, 0, err
	}
	if offset < 0 || offset > c.size {
		return nil, 0, fmt.Errorf("offset %d is outside the archive's %d bytes", offset, c.size)
	}
	s.mu.Lock()
	c.readers++
	s.mu.Unlock()
	defer func() { s.mu.Lock(); c.readers--; s.mu.Unlock() }()
	f, err := os.Open(c.path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	out := make([]byte, min(int64(protocol.ArchiveReadPiece), c.size-offset))
	if _, err := f.ReadAt(out, offset); err != nil {
		return nil, 0, fmt.Errorf("archive %s at %d: %w", short(digest), offset, err)
	}
	return out, c.size, nil
}

// clearCache removes every cached copy (the Server stops).
func (s *Server) clearCache() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for d, c := range s.cache {
		select {
		case <-c.ready:
			os.Remove(c.path)
			delete(s.cache, d)
		default:
		}
	}
}

// fetchWindow is how many pieces a fetch asks for before the first of them
// is answered: the controller reads them from the bucket at once.
const fetchWindow = 4

// Fetch streams the archive named digest from the controller into w, a
// piece at a time (fetchWindow asked for at once, written in order),
// asking on subject (the host's protocol.NodeSubject(node,
// protocol.ArchiveRead)), and returns how many bytes it wrote; the bytes
// must have the digest (ErrDigest). A controller that is busy or away (a
// standby taking over) is asked again until ctx ends.
func Fetch(ctx context.Context, nc *nats.Conn, subject, digest string, w io.Writer) (int64, error) {
	if !IsDigest(digest) {
		return 0, fmt.Errorf("fetch archive %q: %w", digest, ErrNotDigest)
	}
	fail := func(err error) error { return fmt.Errorf("fetch archive %s: %w", short(digest), err) }
	h := sha256.New()
	first, size, err := readPiece(ctx, nc, subject, digest, 0, -1)
	if err != nil {
		return 0, fail(err)
	}
	w = io.MultiWriter(w, h)
	if _, err := w.Write(first); err != nil {
		return 0, fail(err)
	}
	off := int64(len(first))
	type answer struct {
		data []byte
		err  error
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var pending []chan answer
	next := off
	for off < size {
		for len(pending) < fetchWindow && next < size {
			c := make(chan answer, 1)
			go func(at int64) {
				data, _, err := readPiece(ctx, nc, subject, digest, at, size)
				c <- answer{data, err}
			}(next)
			pending = append(pending, c)
			next += min(int64(protocol.ArchiveReadPiece), size-next)
		}
		a := <-pending[0]
		pending = pending[1:]
		if a.err != nil {
			return off, fail(a.err)
		}
		if _, err := w.Write(a.data); err != nil {
			return off, fail(err)
		}
		off += int64(len(a.data))
	}
	if hex.EncodeToString(h.Sum(nil)) != digest {
		return off, fail(ErrDigest)
	}
	return off, nil
}

// readPiece asks for the piece at off, again while the controller is busy
// or away, and checks it is the piece asked for: at off, of size bytes in
// all (size -1: not known yet), as long as a piece there is.
func readPiece(ctx context.Context, nc *nats.Conn, subject, digest string, off, size int64) ([]byte, int64, error) {
	body, _ := json.Marshal(protocol.ArchiveReadRequest{Digest: digest, Offset: off})
	for {
		rctx, cancel := context.WithTimeout(ctx, protocol.AnswerTimeout)
		m, err := nc.RequestWithContext(rctx, subject, body)
		cancel()
		if err == nil && m.Header.Get(protocol.ArchiveError) == protocol.ArchiveBusy {
			err = errors.New(protocol.ArchiveBusy)
		}
		if err != nil {
			// Away or busy: asked again, until ctx says no more.
			select {
			case <-ctx.Done():
				return nil, 0, fmt.Errorf("%w (last: %v)", ctx.Err(), err)
			case <-time.After(250 * time.Millisecond):
			}
			continue
		}
		if e := m.Header.Get(protocol.ArchiveError); e != "" {
			return nil, 0, uncoded(e)
		}
		got, err1 := strconv.ParseInt(m.Header.Get(protocol.ArchiveSize), 10, 64)
		at, err2 := strconv.ParseInt(m.Header.Get(protocol.ArchiveOffset), 10, 64)
		switch {
		case err1 != nil || err2 != nil || at != off:
			return nil, 0, fmt.Errorf("an answer for offset %s, size %s, asked %d", m.Header.Get(protocol.ArchiveOffset), m.Header.Get(protocol.ArchiveSize), off)
		case got > protocol.MaxArchiveBytes:
			return nil, 0, fmt.Errorf("%d bytes: %w", got, ErrTooLarge)
		case size >= 0 && got != size:
			return nil, 0, fmt.Errorf("its size changed from %d to %d bytes: %w", size, got, ErrMismatch)
		case got < off || int64(len(m.Data)) != min(int64(protocol.ArchiveReadPiece), got-off):
			return nil, 0, fmt.Errorf("a piece of %d bytes at %d of %d: %w", len(m.Data), off, got, ErrDigest)
		}
		return m.Data, got, nil
	}
}

// upload is one archive being handed over by a builder.
type upload struct {
	builder, digest, id string
	size, got           int64
	pw                  *io.PipeWriter
	put                 chan error // the Put's outcome
	pieces              chan *nats.Msg
	last                time.Time
	ended               chan struct{}
}

// OnUpload takes a builder's piece (mesh.build.archive.B).
func (s *Server) OnUpload(m *nats.Msg) {
	node := strings.TrimPrefix(m.Subject, protocol.ArchiveUploadSubject(""))
	if !protocol.ValidName(node) || s.refused(m, node, protocol.BuilderInboxPrefix(node)+".") {
		return
	}
	digest := m.Header.Get(protocol.ArchiveDigest)
	off, err := strconv.ParseInt(m.Header.Get(protocol.ArchiveOffset), 10, 64)
	if err != nil {
		answerUpload(m, protocol.ArchiveUploadReply{Error: "a piece names no offset"})
		return
	}
	key := node + "/" + digest
	if off == 0 && len(m.Data) == 0 {
		answerUpload(m, s.begin(node, digest, m))
		return
	}
	s.mu.Lock()
	u := s.uploads[key]
	s.mu.Unlock()
	if u == nil {
		answerUpload(m, protocol.ArchiveUploadReply{Error: "no upload of " + short(digest) + " is open: begin it again"})
		return
	}
	select {
	case u.pieces <- m:
	default:
		answerUpload(m, protocol.ArchiveUploadReply{Error: "a piece sent before the last was answered"})
	}
}

// begin opens an upload: the build must be in flight on that builder, the
// archive within bounds and not held already.
func (s *Server) begin(node, digest string, m *nats.Msg) protocol.ArchiveUploadReply {
	no := func(err error) protocol.ArchiveUploadReply { return protocol.ArchiveUploadReply{Error: coded(err)} }
	if !IsDigest(digest) {
		return no(fmt.Errorf("upload %q: %w", digest, ErrNotDigest))
	}
	size, err := strconv.ParseInt(m.Header.Get(protocol.ArchiveSize), 10, 64)
	if err != nil || size <= 0 {
		return no(errors.New("an upload names no size"))
	}
	if size > protocol.MaxArchiveBytes {
		return no(fmt.Errorf("%d bytes: %w", size, ErrTooLarge))
	}
	ctx, cancel := context.WithTimeout(context.Background(), protocol.AnswerTimeout)
	defer cancel()
	id := m.Header.Get(protocol.ArchiveBuild)
	if err := s.o.Asked(ctx, node, id); err != nil {
		return no(err)
	}
	_, store, err := bucket(ctx, s.nc)
	if err != nil {
		return no(err)
	}
	info, err := store.GetInfo(ctx, digest)
	switch {
	case err == nil && objectDigest(info) == digest:
		return protocol.ArchiveUploadReply{OK: true, Stored: true}
	case err == nil:
		return no(fmt.Errorf("archive %s: %w", short(digest), ErrMismatch))
	case !errors.Is(err, jetstream.ErrObjectNotFound):
		return no(err)
	}
	key := node + "/" + digest
	s.mu.Lock()
	mine := 0
	for _, u := range s.uploads {
		if u.builder == node {
			mine++
		}
	}
	old := s.uploads[key]
	if old == nil && (mine >= uploadsPerBuilder || len(s.uploads) >= maxUploads) {
		s.mu.Unlock()
		return no(fmt.Errorf("%d uploads are under way (at most %d a builder, %d in all): try again when one ends", len(s.uploads), uploadsPerBuilder, maxUploads))
	}
	pr, pw := io.Pipe()
	u := &upload{builder: node, digest: digest, id: id, size: size, pw: pw, put: make(chan error, 1),
		pieces: make(chan *nats.Msg, 1), last: time.Now(), ended: make(chan struct{})}
	s.uploads[key] = u
	s.mu.Unlock()
	if old != nil {
		old.end(errors.New("begun again"))
	}
	go func() {
		err := Put(context.Background(), s.nc, digest, io.LimitReader(pr, size))
		// A put that ended early (refused, or the archive stored meanwhile
		// by another builder) takes no more: the pieces' writes end.
		pr.CloseWithError(errors.Join(err, errors.New("the put ended")))
		u.put <- err
	}()
	go s.take(u)
	return protocol.ArchiveUploadReply{OK: true}
}

// take writes an upload's pieces into its put, in order, answering each.
func (s *Server) take(u *upload) {
	defer s.forget(u)
	for {
		var m *nats.Msg
		select {
		case m = <-u.pieces:
		case <-u.ended:
			return
		}
		off, _ := strconv.ParseInt(m.Header.Get(protocol.ArchiveOffset), 10, 64)
		if off != u.got || u.got+int64(len(m.Data)) > u.size || len(m.Data) > protocol.ArchivePiece {
			answerUpload(m, protocol.ArchiveUploadReply{Error: fmt.Sprintf("a piece of %d bytes at %d, where %d of %d were taken", len(m.Data), off, u.got, u.size)})
			u.end(errors.New("a piece out of order"))
			return
		}
		if _, err := u.pw.Write(m.Data); err != nil {
			if perr := putError(u, err); perr != nil {
				answerUpload(m, protocol.ArchiveUploadReply{Error: coded(perr)})
			} else {
				answerUpload(m, protocol.ArchiveUploadReply{OK: true, Stored: true}) // by another, meanwhile
			}
			return
		}
		s.mu.Lock()
		u.got += int64(len(m.Data))
		u.last = time.Now()
		s.mu.Unlock()
		if u.got < u.size {
			answerUpload(m, protocol.ArchiveUploadReply{OK: true})
			continue
		}
		u.pw.Close()
		select {
		case err := <-u.put:
			if err != nil {
				answerUpload(m, protocol.ArchiveUploadReply{Error: coded(err)})
			} else {
				answerUpload(m, protocol.ArchiveUploadReply{OK: true})
			}
		case <-time.After(lastPieceWait):
			answerUpload(m, protocol.ArchiveUploadReply{Error: "the archive was not stored within " + lastPieceWait.String()})
		}
		return
	}
}

// putError is why a put stopped taking bytes: its own outcome (nil: it
// found the archive stored), or err if it has not ended.
func putError(u *upload, err error) error {
	select {
	case perr := <-u.put:
		return perr
	case <-time.After(time.Second):
		return err
	}
}

// end stops an upload: its put is refused (no archive is named by bytes
// that did not all come).
func (u *upload) end(why error) {
	select {
	case <-u.ended:
	default:
		close(u.ended)
		u.pw.CloseWithError(why)
	}
}

// forget drops an upload that ended.
func (s *Server) forget(u *upload) {
	u.end(errors.New("ended"))
	s.mu.Lock()
	if s.uploads[u.builder+"/"+u.digest] == u {
		delete(s.uploads, u.builder+"/"+u.digest)
	}
	s.mu.Unlock()
}

// endIdle ends the uploads no piece came for within uploadIdle.
func (s *Server) endIdle(now time.Time) {
	s.mu.Lock()
	var idle []*upload
	for _, u := range s.uploads {
		if now.Sub(u.last) > uploadIdle {
			idle = append(idle, u)
		}
	}
	s.mu.Unlock()
	for _, u := range idle {
		u.end(fmt.Errorf("no piece came for %v", uploadIdle))
	}
}

// endUploads ends every upload.
func (s *Server) endUploads(why error) {
	s.mu.Lock()
	all := make([]*upload, 0, len(s.uploads))
	for _, u := range s.uploads {
		all = append(all, u)
	}
	s.mu.Unlock()
	for _, u := range all {
		u.end(why)
	}
}

func answerUpload(m *nats.Msg, r protocol.ArchiveUploadReply) {
	b, _ := json.Marshal(r)
	_ = m.Respond(b)
}

// Upload hands the controller an archive of size bytes read from r, the
// outcome of build id, on subject (the builder's
// protocol.ArchiveUploadSubject(node)), a piece at a time, each waited
// for. An archive the controller holds already is not read at all.
func Upload(ctx context.Context, nc *nats.Conn, subject, id, digest string, size int64, r io.Reader) error {
	if !IsDigest(digest) {
		return fmt.Errorf("upload archive %q: %w", digest, ErrNotDigest)
	}
	fail := func(err error) error { return fmt.Errorf("upload archive %s: %w", short(digest), err) }
	send := func(off int64, data []byte, wait time.Duration) (protocol.ArchiveUploadReply, error) {
		m := nats.NewMsg(subject)
		m.Header.Set(protocol.ArchiveBuild, id)
		m.Header.Set(protocol.ArchiveDigest, digest)
		m.Header.Set(protocol.ArchiveSize, strconv.FormatInt(size, 10))
		m.Header.Set(protocol.ArchiveOffset, strconv.FormatInt(off, 10))
		m.Data = data
		rctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		a, err := nc.RequestMsgWithContext(rctx, m)
		if err != nil {
			return protocol.ArchiveUploadReply{}, err
		}
		var reply protocol.ArchiveUploadReply
		if err := json.Unmarshal(a.Data, &reply); err != nil {
			return reply, fmt.Errorf("an answer that is not JSON: %w", err)
		}
		if reply.Error != "" {
			return reply, uncoded(reply.Error)
		}
		return reply, nil
	}
	reply, err := send(0, nil, protocol.AnswerTimeout)
	if err != nil {
		return fail(err)
	}
	if reply.Stored {
		return nil
	}
	buf := make([]byte, protocol.ArchivePiece)
	for off := int64(0); off < size; {
		n, err := io.ReadFull(r, buf[:min(int64(len(buf)), size-off)])
		if err != nil {
			return fail(fmt.Errorf("read the archive at %d of %d bytes: %w", off, size, err))
		}
		wait := protocol.AnswerTimeout
		if off+int64(n) == size {
			wait = lastPieceWait + protocol.AnswerTimeout
		}
		if _, err := send(off, buf[:n], wait); err != nil {
			return fail(err)
		}
		off += int64(n)
	}
	return nil
}
