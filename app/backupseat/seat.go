// Package backupseat is the backup seat's holder (cmd/mesh-backup, the
// backup module's run.command): it keeps one restic repository per node
// beneath its repository data set, serves them to their nodes through a
// restic REST server (github.com/restic/rest-server as a library:
// append-only, one private repository per node, each node's own REST user),
// says when each backup line is due, issues each node its access sealed to
// it, prunes as the manifest's retention says (only here: a node can only
// append) and drills restores. Every repository is encrypted with the
// repository_password secret, so a person opens it with a stock restic and
// that password alone.
package backupseat

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"filippo.io/age"
	"github.com/nats-io/nats.go"
	restserver "github.com/restic/rest-server"

	"mesh-controller/app/protocol"
	"mesh-controller/app/restic"
)

// Options are what the holder is given (its environment, as a host runs it).
type Options struct {
	// Broker is the broker's URL(s); Creds its module user's .creds file.
	Broker, Creds string
	// Node is the node it runs on; Module its module's name (backup).
	Node, Module string
	// Repositories is its repository data set: one restic repository per
	// node beneath it, named as the node.
	Repositories string
	// Scratch is where drills restore (its cache data set).
	Scratch string
	// Password is the repository_password secret.
	Password protocol.Secret
	// Lines is the file its host writes its backup lines to.
	Lines string
	// Listen is where its REST server listens (host:port).
	Listen string
	// Tick is how often it reads its lines and looks for what is due
	// (0: every 15 seconds).
	Tick time.Duration
	// Log receives its log lines.
	Log io.Writer
}

// Seat is a running holder.
type Seat struct {
	o   Options
	nc  *nats.Conn
	log *slog.Logger

	mu    sync.Mutex
	lines []protocol.BackupLine
	// users are the nodes with a line: each may reach its own repository.
	users map[string]bool
	// issued is, per node, the recipient its access was last sealed to
	// and when.
	issued map[string]issue
	// asked is when each line was last said due; drilled when each was
	// last drilled (passing or not); pruned when each was last pruned and
	// the last backup it was pruned after.
	asked, drilled map[string]time.Time
	pruned         map[string]pruned
	// repoLocks orders the holder's own work on one repository.
	repoLocks map[string]*sync.Mutex
	// ready are the repositories made (or found) here.
	ready map[string]bool

	work  chan struct{} // bounds drills, prunes and tool answers at once
	wg    sync.WaitGroup
	Addr  net.Addr // where the REST server listens, once Serve started it
	addrc chan net.Addr
}

// pruned is a line's last prune.
type pruned struct{ at, after time.Time }

// issue is one sealed access handed over.
type issue struct {
	recipient string
	at        time.Time
}

// workers bounds the holder's work at once (drills restore whole data sets).
const workers = 2

// New makes a holder.
func New(o Options) *Seat {
	if o.Tick <= 0 {
		o.Tick = 15 * time.Second
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	return &Seat{o: o, log: slog.New(slog.NewTextHandler(o.Log, nil)).With("node", o.Node),
		users: map[string]bool{}, issued: map[string]issue{}, asked: map[string]time.Time{}, drilled: map[string]time.Time{},
		pruned: map[string]pruned{}, repoLocks: map[string]*sync.Mutex{}, ready: map[string]bool{},
		work: make(chan struct{}, workers), addrc: make(chan net.Addr, 1)}
}

// Listening is where the REST server listens, once it does.
func (s *Seat) Listening() <-chan net.Addr { return s.addrc }

// Serve runs the holder until ctx ends.
func (s *Seat) Serve(ctx context.Context) error {
	o := s.o
	if !protocol.ValidName(o.Node) || !protocol.ValidName(o.Module) {
		return fmt.Errorf("node %q and module %q must be valid names: run me as a module (MESH_NODE, MESH_MODULE)", o.Node, o.Module)
	}
	if o.Password.Len() == 0 {
		return errors.New("no repository_password: give the backup module its secret (mesh-controller secret accept NODE backup repository_password --from FILE)")
	}
	for _, d := range []string{o.Repositories, o.Scratch} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	if _, err := restic.Version(ctx); err != nil {
		return err
	}
	h, err := s.Handler()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s for the REST server: %w", o.Listen, err)
	}
	s.Addr = ln.Addr()
	s.addrc <- ln.Addr()
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
	go hs.Serve(ln)
	defer hs.Close()

	// Its answers come to an inbox beneath its node's, the only one its
	// broker user may read.
	nc, err := nats.Connect(o.Broker, nats.UserCredentials(o.Creds), nats.Name("mesh-backup "+o.Node),
		nats.CustomInboxPrefix(protocol.BackupInboxPrefix(o.Node)), nats.MaxReconnects(-1), nats.ReconnectWait(time.Second))
	if err != nil {
		return fmt.Errorf("connect to %s: %w", o.Broker, err)
	}
	defer nc.Close()
	s.nc = nc
	for tool, do := range map[string]func(context.Context, []byte) any{
		protocol.ToolSnapshots: s.toolSnapshots, protocol.ToolVerify: s.toolVerify, protocol.ToolGrant: s.toolGrant,
	} {
		if _, err := nc.Subscribe(protocol.ToolSubjectOn(o.Module, tool, o.Node), s.answer(ctx, do)); err != nil {
			return err
		}
	}
	if err := nc.Flush(); err != nil {
		return err
	}
	s.log.Info("serving backups", "rest", ln.Addr().String(), "repositories", o.Repositories, "tick", o.Tick)
	defer s.wg.Wait()
	t := time.NewTicker(o.Tick)
	defer t.Stop()
	for {
		s.round(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Handler is the holder's REST server: rest-server over the repositories
// (append-only, each node's repository its own) behind the nodes' REST
// users. Serve serves it; a test may serve it without a broker.
func (s *Seat) Handler() (http.Handler, error) {
	// No .htpasswd: the node's REST password is derived from the
	// repository password (nothing to store), checked here, and the node
	// handed to rest-server as the proxy's user.
	h, err := restserver.NewHandler(&restserver.Server{Path: s.o.Repositories, AppendOnly: true, PrivateRepos: true, ProxyAuthUsername: nodeHeader})
	if err != nil {
		return nil, fmt.Errorf("the REST server: %w", err)
	}
	return s.auth(h), nil
}

// nodeHeader carries the node a request's REST user is to rest-server; a
// request's own is removed first.
const nodeHeader = "X-Mesh-Backup-Node"

// auth lets a node's REST user through to rest-server as that node, and no
// one else.
func (s *Seat) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Del(nodeHeader)
		user, password, ok := r.BasicAuth()
		s.mu.Lock()
		known := s.users[user]
		s.mu.Unlock()
		if !ok || !known || subtle.ConstantTimeCompare([]byte(password), []byte(s.restPassword(user))) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="mesh-backup"`)
			http.Error(w, "401 unauthorized", http.StatusUnauthorized)
			return
		}
		r.Header.Set(nodeHeader, user)
		next.ServeHTTP(w, r)
	})
}

func (s *Seat) restPassword(node string) string { return NodePassword(s.o.Password.Reveal(), node) }

// NodePassword is node's REST password: the repository password's HMAC of
// the node's name, so the holder makes it again the same at every start
// and keeps it nowhere (whoever has the repository password reads every
// repository anyway).
func NodePassword(repositoryPassword []byte, node string) string {
	m := hmac.New(sha256.New, repositoryPassword)
	m.Write([]byte("mesh-backup rest user\x00" + node))
	return hex.EncodeToString(m.Sum(nil))
}

// access is node's access.
func (s *Seat) access(node string) protocol.BackupAccess {
	return protocol.BackupAccess{User: node, Password: s.restPassword(node), RepositoryPassword: string(s.o.Password.Reveal())}
}

// seal seals node's access to recipient, for the node to.
func (s *Seat) seal(node, to, recipient string) (string, error) {
	r, err := age.ParseX25519Recipient(recipient)
	if err != nil {
		return "", fmt.Errorf("%s's recipient: %w", to, err)
	}
	b, err := json.Marshal(s.access(node))
	if err != nil {
		return "", err
	}
	v := protocol.NewSecret(b)
	clear(b)
	return protocol.SealSecret(v, protocol.Label{Node: to, Module: protocol.BackupModule, Name: protocol.BackupAccessName}, r)
}

// repo is node's repository, opened here on the holder's own disk.
func (s *Seat) repo(node string) restic.Repo {
	return restic.Repo{Repository: filepath.Join(s.o.Repositories, node), Password: string(s.o.Password.Reveal())}
}

// lockRepo orders the holder's own work on node's repository.
func (s *Seat) lockRepo(node string) func() {
	s.mu.Lock()
	l := s.repoLocks[node]
	if l == nil {
		l = &sync.Mutex{}
		s.repoLocks[node] = l
	}
	s.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// readLines reads the lines file; a file not there yet is no lines.
func (s *Seat) readLines() ([]protocol.BackupLine, error) {
	b, err := os.ReadFile(s.o.Lines)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ls protocol.BackupLines
	if err := json.Unmarshal(b, &ls); err != nil {
		return nil, fmt.Errorf("the backup lines in %s: %w", s.o.Lines, err)
	}
	return ls.Lines, nil
}

// key names a line.
func key(l protocol.BackupLine) string { return l.Node + "/" + l.Module + "/" + l.Data }

// Period is how long a line's cadence is: a duration as the controller
// writes it ("1h0m0s"), or the manifest's word (0: neither).
func Period(cadence string) time.Duration {
	switch cadence {
	case "hourly":
		return time.Hour
	case "daily":
		return 24 * time.Hour
	case "weekly":
		return 7 * 24 * time.Hour
	}
	if d, err := time.ParseDuration(cadence); err == nil && d > 0 {
		return d
	}
	return 0
}

// retry is how long a line said due waits before it is said due again
// when no backup was heard of it.
func retry(p time.Duration) time.Duration { return min(p/6, 10*time.Minute) }

// accessGrace lets a node's declaration carry its new access before its
// first backup is asked.
const accessGrace = 5 * time.Second

// round reads the lines and does what is due: repositories made, accesses
// issued, lines said due, prunes and drills started.
func (s *Seat) round(ctx context.Context) {
	lines, err := s.readLines()
	if err != nil {
		s.log.Warn("cannot read the backup lines", "err", err)
		return
	}
	now := time.Now()
	users := map[string]bool{}
	recipients := map[string]string{}
	for _, l := range lines {
		if protocol.ValidName(l.Node) {
			users[l.Node] = true
			if l.Recipient != "" {
				recipients[l.Node] = l.Recipient
			}
		}
	}
	s.mu.Lock()
	s.lines, s.users = lines, users
	s.mu.Unlock()
	for _, node := range sortedKeys(users) {
		if ctx.Err() != nil {
			return
		}
		if err := s.ensureRepo(ctx, node); err != nil {
			s.log.Warn("the repository is not ready", "of", node, "err", err)
			continue
		}
		if r := recipients[node]; r != "" && s.issuedTo(node) != r {
			if err := s.issue(node, r); err != nil {
				s.log.Warn("the access is not handed over", "of", node, "err", err)
			}
		}
	}
	for _, l := range lines {
		if ctx.Err() != nil {
			return
		}
		s.due(l, now)
		s.afterBackup(ctx, l, now)
	}
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// ensureRepo makes node's repository here when it is not there yet.
func (s *Seat) ensureRepo(ctx context.Context, node string) error {
	s.mu.Lock()
	ready := s.ready[node]
	s.mu.Unlock()
	if ready {
		return nil
	}
	defer s.lockRepo(node)()
	if err := s.repo(node).Init(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	s.ready[node] = true
	s.mu.Unlock()
	return nil
}

func (s *Seat) issuedTo(node string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.issued[node].recipient
}

// issue hands the controller node's access sealed to it.
func (s *Seat) issue(node, recipient string) error {
	sealed, err := s.seal(node, node, recipient)
	if err != nil {
		return err
	}
	if err := s.request(protocol.BackupAccessSubject(s.o.Node), protocol.BackupAccessIssued{Node: node, Sealed: sealed}); err != nil {
		return err
	}
	s.mu.Lock()
	s.issued[node] = issue{recipient: recipient, at: time.Now()}
	s.mu.Unlock()
	s.log.Info("access handed over", "of", node)
	return nil
}

// request asks the controller on subject and reads its OKReply.
func (s *Seat) request(subject string, body any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	m, err := s.nc.Request(subject, b, 30*time.Second)
	if err != nil {
		return fmt.Errorf("the controller did not answer: %w", err)
	}
	var ok protocol.OKReply
	if err := json.Unmarshal(m.Data, &ok); err != nil {
		return err
	}
	if !ok.OK {
		return fmt.Errorf("the controller refused: %s", ok.Error)
	}
	return nil
}

// due says a line is due when its cadence has passed since its last
// backup (or it has none), and it was not said due within its retry.
func (s *Seat) due(l protocol.BackupLine, now time.Time) {
	p := Period(l.Cadence)
	if p == 0 || (l.LastBackup != nil && now.Sub(*l.LastBackup) < p) {
		return
	}
	k := key(l)
	s.mu.Lock()
	last, iss := s.asked[k], s.issued[l.Node]
	s.mu.Unlock()
	if now.Sub(last) < retry(p) || iss.at.IsZero() || now.Sub(iss.at) < accessGrace {
		return
	}
	s.mu.Lock()
	s.asked[k] = now
	s.mu.Unlock()
	if err := s.request(protocol.BackupDueSubject(s.o.Node), protocol.BackupDue{Node: l.Node, Module: l.Module, Data: l.Data}); err != nil {
		s.log.Warn("a due backup was not asked", "line", k, "err", err)
		return
	}
	s.log.Info("backup due, asked", "line", k)
}

// afterBackup prunes a line after a new backup, at most once a cadence (a
// prune holds the repository exclusively: what the node asks meanwhile
// waits), and drills it when no drill passed within two cadences (the
// bound is seven).
func (s *Seat) afterBackup(ctx context.Context, l protocol.BackupLine, now time.Time) {
	if l.LastBackup == nil {
		return
	}
	k, p := key(l), Period(l.Cadence)
	s.mu.Lock()
	last := s.pruned[k]
	prune := l.LastBackup.After(last.after) && now.Sub(last.at) >= p
	drill := (l.LastVerified == nil || now.Sub(*l.LastVerified) >= 2*p) && now.Sub(s.drilled[k]) >= retry(p)
	if prune {
		s.pruned[k] = pruned{at: now, after: *l.LastBackup}
	}
	if drill {
		s.drilled[k] = now
	}
	s.mu.Unlock()
	if !prune && !drill {
		return
	}
	s.background(ctx, func(ctx context.Context) {
		if prune {
			if err := s.prune(ctx, l); err != nil {
				s.log.Warn("prune failed", "line", k, "err", err)
			}
		}
		if drill {
			o := s.Drill(ctx, l.Node, l.Module, l.Data)
			s.report(o)
		}
	})
}

// background runs f in a worker when one is free; the next round tries
// again otherwise.
func (s *Seat) background(ctx context.Context, f func(context.Context)) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		select {
		case s.work <- struct{}{}:
		case <-ctx.Done():
			return
		}
		defer func() { <-s.work }()
		f(ctx)
	}()
}

// keep is a line's retention (the default where it names none), less the
// periods finer than its cadence (restic's --keep-hourly 24 keeps the last
// of each of the 24 latest hours that have one: a daily line would keep 24
// days), and every snapshot of its last two cadences: one taken by hand or
// before a risky act is not forgotten by the next backup of the same hour.
func keep(l protocol.BackupLine) restic.Keep {
	k := l.Keep
	if k == (protocol.Retention{}) {
		k = protocol.DefaultRetention
	}
	p := Period(l.Cadence)
	if p >= 24*time.Hour {
		k.Hourly = 0
	}
	if p >= 7*24*time.Hour {
		k.Daily = 0
	}
	return restic.Keep{Hourly: k.Hourly, Daily: k.Daily, Weekly: k.Weekly, Monthly: k.Monthly, Within: 2 * p}
}

// prune forgets a line's snapshots beyond its retention and prunes.
func (s *Seat) prune(ctx context.Context, l protocol.BackupLine) error {
	defer s.lockRepo(l.Node)()
	return s.repo(l.Node).Forget(ctx, protocol.BackupTag(l.Module, l.Data), keep(l))
}

// report tells the controller of a drill.
func (s *Seat) report(o protocol.DrillOutcome) {
	if err := s.request(protocol.DrillSubject(s.o.Node), o); err != nil {
		s.log.Warn("a drill was not reported", "line", o.Node+"/"+o.Module+"/"+o.Data, "err", err)
		return
	}
	s.log.Info("drilled", "line", o.Node+"/"+o.Module+"/"+o.Data, "ok", o.OK, "snapshot", o.Snapshot, "why", o.Why)
}

// line finds a line by its names.
func (s *Seat) line(node, module, data string) (protocol.BackupLine, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.lines {
		if l.Node == node && l.Module == module && l.Data == data {
			return l, true
		}
	}
	return protocol.BackupLine{}, false
}

// answer answers a tool's asks off the subscription's goroutine.
func (s *Seat) answer(ctx context.Context, do func(context.Context, []byte) any) nats.MsgHandler {
	return func(m *nats.Msg) {
		s.background(ctx, func(ctx context.Context) {
			b, _ := json.Marshal(do(ctx, m.Data))
			_ = m.Respond(b)
		})
	}
}

func (s *Seat) toolSnapshots(ctx context.Context, data []byte) any {
	var a protocol.SnapshotsAsk
	if err := json.Unmarshal(data, &a); err != nil {
		return protocol.SnapshotsAnswer{Error: err.Error()}
	}
	if _, ok := s.line(a.Node, a.Module, a.Data); !ok {
		return protocol.SnapshotsAnswer{Error: fmt.Sprintf("no backup line of %s/%s/%s here", a.Node, a.Module, a.Data)}
	}
	ss, err := s.snapshots(ctx, a.Node, a.Module, a.Data)
	if err != nil {
		return protocol.SnapshotsAnswer{Error: err.Error()}
	}
	out := protocol.SnapshotsAnswer{Snapshots: make([]protocol.Snapshot, 0, len(ss))}
	for _, x := range ss {
		out.Snapshots = append(out.Snapshots, protocol.Snapshot{ID: x.ID, Time: x.Time, Paths: x.Paths, Tags: x.Tags})
	}
	return out
}

func (s *Seat) snapshots(ctx context.Context, node, module, data string) ([]restic.Snapshot, error) {
	if err := s.ensureRepo(ctx, node); err != nil {
		return nil, err
	}
	defer s.lockRepo(node)()
	return s.repo(node).Snapshots(ctx, protocol.BackupTag(module, data))
}

func (s *Seat) toolVerify(ctx context.Context, data []byte) any {
	var a protocol.SnapshotsAsk
	if err := json.Unmarshal(data, &a); err != nil {
		return protocol.DrillOutcome{Why: err.Error()}
	}
	if _, ok := s.line(a.Node, a.Module, a.Data); !ok {
		return protocol.DrillOutcome{Node: a.Node, Module: a.Module, Data: a.Data, Why: fmt.Sprintf("no backup line of %s/%s/%s here", a.Node, a.Module, a.Data), At: time.Now()}
	}
	o := s.Drill(ctx, a.Node, a.Module, a.Data)
	s.report(o)
	return o
}

func (s *Seat) toolGrant(_ context.Context, data []byte) any {
	var a protocol.GrantAsk
	if err := json.Unmarshal(data, &a); err != nil || !protocol.ValidName(a.From) || !protocol.ValidName(a.To) {
		return protocol.BackupAccessIssued{}
	}
	s.mu.Lock()
	known := s.users[a.From]
	s.mu.Unlock()
	if !known {
		return protocol.BackupAccessIssued{Node: a.To}
	}
	sealed, err := s.seal(a.From, a.To, a.Recipient)
	if err != nil {
		s.log.Warn("a grant not sealed", "from", a.From, "to", a.To, "err", err)
		return protocol.BackupAccessIssued{Node: a.To}
	}
	s.log.Info("access granted", "of", a.From, "to", a.To)
	return protocol.BackupAccessIssued{Node: a.To, Sealed: sealed}
}
