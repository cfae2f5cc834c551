# mesh-controller: one static binary. `make run` builds and starts it on the
# default data dir; `make test` runs every test. Nothing else needs installing
# but Go: modules come through the Go module proxy on first build.

GO       ?= go
BIN      := bin
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null)
LDFLAGS  := -s -w $(if $(VERSION),-X main.version=$(VERSION))
export CGO_ENABLED := 0

.PHONY: build modules nats-server previous-release release run demo demo-ha test tools gotestsum redocly promtool lint bench bench-postgres soak measure-archives fuzz clean

# modules fetches the Go modules once, saying so: on an empty module cache
# the first build otherwise sits silent for most of a minute.
modules:
	@[ -d "$$($(GO) env GOMODCACHE)/github.com/nats-io/nats-server" ] || { \
		echo "fetching Go modules through the Go module proxy (first build only; about a minute)"; \
		$(GO) mod download; }

build: modules
	@echo "building bin/mesh-controller, bin/mesh-host, bin/mesh-builder and bin/mesh-backup (static, CGO_ENABLED=0)"
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/mesh-controller ./cmd/mesh-controller
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/mesh-host ./cmd/mesh-host
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/mesh-builder ./cmd/mesh-builder
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/mesh-backup ./cmd/mesh-backup

# nats-server is the NATS server of the version go.mod names, built from
# its module: what a broker cluster's servers run ('mesh-controller broker
# show --config' prints their configuration), and what make test runs a
# cluster of on loopback.
nats-server: modules
	$(GO) build -trimpath -ldflags '-s -w' -o $(BIN)/nats-server github.com/nats-io/nats-server/v2

# promtool: Prometheus's own checker of the text format, which the tests
# run on what a real controller's and a real host's /metrics say. It is
# the /usr/bin/promtool of Debian's prometheus package, taken out of the
# package (apt-get download: 19 MB, a few seconds) into bin/, never
# installed: installing the package would add its web assets and start a
# Prometheus server where there is no systemd (its postinst runs
# invoke-rc.d). Built from its Go module instead (go install
# github.com/prometheus/prometheus/cmd/promtool@v0.316.0) it took 199
# modules (1.8 GB), 1.8 GB of build cache and 19 minutes on this 2-core
# machine, for a 118 MB binary; this takes 5 seconds, for 48 MB.
promtool:
	@[ -x $(BIN)/promtool ] || { \
		echo "promtool: taking it out of Debian's prometheus package into $(BIN)/ (apt-get download, not installed)"; \
		dir=$$(mktemp -d) && mkdir -p $(BIN) && \
		{ (cd $$dir && apt-get download -qq prometheus) >/dev/null 2>&1 || \
		  { [ "$$(id -u)" = 0 ] && apt-get update -qq >/dev/null 2>&1 && (cd $$dir && apt-get download -qq prometheus) >/dev/null 2>&1; }; } && \
		dpkg-deb --fsys-tarfile $$dir/prometheus_*.deb | tar -xO ./usr/bin/promtool > $(BIN)/promtool.tmp && \
		chmod 755 $(BIN)/promtool.tmp && mv $(BIN)/promtool.tmp $(BIN)/promtool; \
		status=$$?; rm -rf $$dir $(BIN)/promtool.tmp; \
		[ $$status = 0 ] || { echo "make test: could not take promtool out of Debian's prometheus package: run apt-get update, then make promtool again"; exit 1; }; }

# previous-release: the previous release's mesh-controller and mesh-host,
# built from its git tag (scripts/previous-release names it) into
# bin/previous/<commit>, once: the tests that run them beside this tree's
# (app/e2e's TestPreviousRelease_*) find them there. A clone without the
# tag and its commit is told to 'git fetch --tags'.
previous-release: modules
	@scripts/previous-release >/dev/null

# release: what a release ships, into dist/ (made anew, git-ignored):
# every program for linux/amd64 and linux/arm64, static and stamped with
# VERSION (git describe, or VERSION=v1.2.3 on make's line), as
# <program>_<version>_linux_<arch>; a .deb of mesh-controller and one of
# mesh-host (with mesh-builder and mesh-backup) per arch, made by nfpm
# (scripts/release runs it through the Go module proxy); and SHA256SUMS,
# which 'sha256sum -c SHA256SUMS' checks in dist/.
release: modules
	rm -rf dist
	$(GO) run ./scripts/release -version '$(VERSION)' -out dist

# run migrates the default data dir (or $MESH_DATA) and serves until Ctrl-C.
run: build
	$(BIN)/mesh-controller migrate
	$(BIN)/mesh-controller serve

# demo: a controller and two hosts in a temporary dir: modules planned and run (hello asked, killed,
# restarted, logged, stopped), a Go program built from a local git repository by the builder module
# and run on the other host; a third host joined as adopted, where a stand-in (perl) holds the port a
# module declares, and the module taken onto it (the preview, its digest confirmed, the stand-in
# stopped by its host, plan saying it was taken); health and the board; then all stopped.
demo: build
	@set -eu; dir=$$(mktemp -d); export MESH_DATA=$$dir/controller; mc=$(BIN)/mesh-controller; mh=$(BIN)/mesh-host; \
	pids=""; alive() { for p in $$pids; do kill -0 $$p 2>/dev/null && return 0; done; return 1; }; \
	trap 'kill $$pids 2>/dev/null || true; for i in $$(seq 300); do alive || break; sleep 0.1; done; kill -9 $$pids 2>/dev/null || true; wait 2>/dev/null || true; rm -rf $$dir' EXIT; \
	waitfor() { end=$$(( $$(date +%s) + $$1 )); until eval "$$3"; do \
		[ $$(date +%s) -lt $$end ] || { echo "demo: gave up after $$1 s waiting for $$2 ($$3)" >&2; return 1; }; sleep 0.1; done; }; \
	$$mc migrate >/dev/null 2>&1; \
	$$mc serve --listen 127.0.0.1:0 >$$dir/serve.log 2>&1 & pids="$$pids $$!"; \
	waitfor 30 "serve's ready line" "grep -q '^ready' $$dir/serve.log" || { cat $$dir/serve.log; exit 1; }; \
	grep '^ready' $$dir/serve.log; \
	url=$$(sed -n 's/^ready: broker \([^,]*\),.*/\1/p' $$dir/serve.log); \
	for n in web1 web2; do \
		tok=$$($$mc token issue --new $$n 2>/dev/null); \
		$$mh join --broker $$url --token $$tok --node $$n --state $$dir/$$n/state 2>/dev/null; \
		$$mh run --state $$dir/$$n/state --root $$dir/$$n/root --heartbeat 1s --no-module-users --no-overlay-interface >$$dir/$$n.log 2>&1 & pids="$$pids $$!"; eval "pid_$$n=$$!"; \
	done; \
	waitfor 30 "web1 and web2 to join and report their facts" '[ $$($$mc node list --json | grep -c "\"serial_applied\"") -eq 2 ] && $$mc node show web2 --json | grep -q "\"name\": \"arch\""'; \
	ex=../shared/examples; [ -d $$ex ] || ex=contexts/inventory/testdata; \
	$$mc module check $$ex/*.json; \
	for m in postgres smtp-relay paperless; do $$mc module add $$ex/$$m.json 2>/dev/null; done; \
	$$mc operator key make --out $$dir/operator.key >$$dir/operator.pub; $$mc operator key set $$(cat $$dir/operator.pub); \
	$$mc assign web2 postgres smtp-relay 2>/dev/null; $$mc assign web1 paperless 2>/dev/null; \
	printf 'demo-licence-key' >$$dir/ocr.txt; $$mc secret accept web1 paperless ocr_licence --from $$dir/ocr.txt; \
	printf 'upstream-pass' >$$dir/up.txt; $$mc secret accept web2 smtp-relay upstream_password --from $$dir/up.txt 2>/dev/null; \
	waitfor 30 "every node to apply its plan" '! $$mc node list --json | grep -q "\"behind\": true"'; \
	echo; $$mc node list; echo; $$mc plan web1; echo; $$mc node show web1 | head -30; echo; $$mc data; \
	echo; echo "web1 wrote under its root:"; (cd $$dir/web1/root && find . -mindepth 1 | sort | sed 's/^/  /'); \
	echo; echo "break-glass, with the operator key alone:"; $$mc secret export --out $$dir/export.json; \
	$$mc secret recover web1 paperless ocr_licence --key $$dir/operator.key --from-export $$dir/export.json --out $$dir/recovered; \
	echo "  recovered: $$(cat $$dir/recovered)"; \
	echo; echo "the example module, hello (app/host/testdata/hello), built and put where its manifest's run.command finds it on web1:"; \
	$(GO) build -o $$dir/web1/root/etc/mesh/modules/hello/bin/hello ./app/host/testdata/hello; \
	$$mc module add app/host/testdata/hello/mesh.json; $$mc assign web1 hello; \
	state() { $$mc node show web1 | grep '^  hello '; }; \
	waitfor 30 "hello ready on web1" "state | grep -q ' ready '" || { tail -20 $$dir/web1.log; exit 1; }; \
	echo "  $$(state | tr -s ' ')"; \
	echo "asked: mesh-controller ask hello greet '{\"name\": \"demo\"}'"; $$mc ask hello greet '{"name": "demo"}'; \
	pid=$$(state | sed -n 's/.*pid \([0-9]*\).*/\1/p'); echo "killed with kill -9 $$pid; its host restarts it:"; kill -9 $$pid; \
	waitfor 30 "hello restarted" "state | grep ' ready ' | grep -qvw 'pid $$pid'"; \
	echo "  $$(state | tr -s ' ')"; \
	echo "its log, from its host over the broker (mesh-controller logs web1 hello --lines 8):"; $$mc logs web1 hello --lines 8 | sed 's/^/  | /'; \
	$$mc unassign web1 hello >/dev/null 2>&1; \
	waitfor 30 "hello stopped" "! state >/dev/null"; \
	echo "unassigned: stopped (no process left: $$(pgrep -f $$dir/web1/root/etc/mesh/modules/hello/bin/hello || echo none)); its data kept: starts = $$(cat $$dir/web1/root/var/lib/hello/starts)"; \
	echo; echo "a build: web2 runs the example builder module (mesh-builder), which builds a Go program from a local git repository; web1 runs what it built:"; \
	mkdir -p $$dir/web2/root/etc/mesh/modules/builder/bin && cp $(BIN)/mesh-builder $$dir/web2/root/etc/mesh/modules/builder/bin/builder; \
	$$mc module add $$ex/builder.json >/dev/null 2>&1; $$mc assign web2 builder >/dev/null 2>&1; \
	waitfor 30 "the builder ready on web2" "$$mc node show web2 | grep -q '^  builder .* ready '" || { tail -20 $$dir/web2.log; exit 1; }; \
	g=$$dir/greeter; mkdir -p $$g && git -C $$g init -q -b main; \
	printf 'package main\n\nimport ("fmt"; "net"; "os"; "os/signal"; "syscall")\n\nfunc main() {\n\tln, err := net.Listen("tcp", "127.0.0.1:18490")\n\tif err != nil { fmt.Println(err); os.Exit(1) }\n\tfmt.Println("greeter listening on", ln.Addr())\n\tgo func() { for { c, err := ln.Accept(); if err != nil { return }; fmt.Fprintln(c, "hello from a built module"); c.Close() } }()\n\tstop := make(chan os.Signal, 1); signal.Notify(stop, syscall.SIGTERM); <-stop\n}\n' > $$g/main.go; \
	printf 'module greeter\n\ngo 1.22\n' > $$g/go.mod; \
	printf '{"module": "greeter", "version": "1.0.0", "build": {"command": ["go", "build", "-o", "bin/greeter", "."], "outputs": ["bin/"], "timeout": "5m", "env": {"CGO_ENABLED": "0", "GOTOOLCHAIN": "local"}}, "run": {"command": ["bin/greeter"], "ready": {"port": "http"}}, "ports": [{"name": "http", "port": 18490}]}\n' > $$g/mesh.json; \
	git -C $$g add . && git -C $$g -c user.name=demo -c user.email=demo@example commit -q -m "greeter 1.0.0"; \
	$$mc build $$g 2>&1 | grep -v '^  |' | sed 's/^/  /'; \
	$$mc assign web1 greeter >/dev/null 2>&1; \
	waitfor 60 "greeter ready on web1" "$$mc node show web1 | grep -q '^  greeter .* ready '" || { tail -20 $$dir/web1.log; exit 1; }; \
	$$mc node show web1 | grep '^  greeter .* ready ' | tr -s ' '; \
	echo "  it runs from $$(ls -d $$dir/web1/root/etc/mesh/modules/greeter/1.0.0) and answers: $$(curl -s --max-time 2 telnet://127.0.0.1:18490 </dev/null || true)"; \
	echo; echo "backups: web2 runs the example backup module (mesh-backup: a restic repository per node behind a REST server); web1's paperless media is backed up on its cadence, by hand, and restored:"; \
	command -v restic >/dev/null || { echo "make demo needs Debian's restic: apt-get install --no-install-recommends restic"; exit 1; }; \
	mkdir -p $$dir/web2/root/etc/mesh/modules/backup/bin && cp $(BIN)/mesh-backup $$dir/web2/root/etc/mesh/modules/backup/bin/backup; \
	$$mc module add $$ex/backup.json >/dev/null 2>&1; \
	printf '{"address": "127.0.0.1", "port": 18491}' >$$dir/backup-settings.json; $$mc settings set backup $$dir/backup-settings.json >/dev/null; \
	$$mc assign web2 backup >/dev/null 2>&1; \
	printf 'demo-repository-password' >$$dir/rp.txt; $$mc secret accept web2 backup repository_password --from $$dir/rp.txt >/dev/null; \
	media=$$dir/web1/root/var/lib/paperless/media; mkdir -p $$media; echo "scan 1: the lease" >$$media/scan1.txt; \
	verified() { $$mc data --json | tr -d ' \n' | grep -q '"node":"web1","module":"paperless","name":"media","[^}]*"last_verified":"'; }; \
	waitfor 120 "web1's media backed up and drilled" verified || { tail -20 $$dir/web2/root/var/log/mesh/backup.log; exit 1; }; \
	echo "  on its cadence, no one asking, and a restore drill passed: $$($$mc data | grep ' media ' | tr -s ' ')"; \
	echo "scan 2: the deed" >$$media/scan2.txt; \
	$$mc data backup web1/paperless/media --why "the demo" | sed 's/^/  by hand: /'; \
	echo damaged >$$media/scan1.txt; rm $$media/scan2.txt; echo "  scan1.txt damaged, scan2.txt deleted; mesh-controller data restore web1/paperless/media:"; \
	$$mc data restore web1/paperless/media --why "the demo damaged it" | sed 's/^/  /'; \
	[ "$$(cat $$media/scan1.txt)" = "scan 1: the lease" ] && [ "$$(cat $$media/scan2.txt)" = "scan 2: the deed" ] || { echo "the restore did not bring the scans back"; exit 1; }; \
	echo "  restored: $$(cat $$media/scan1.txt); $$(cat $$media/scan2.txt)"; \
	echo "  break-glass, Debian's restic and the repository password alone:"; \
	RESTIC_PASSWORD=demo-repository-password restic --no-cache -r $$dir/web2/root/srv/backup/repository/web1 snapshots --tag mesh:paperless/media | sed 's/^/    /'; \
	echo; echo "an adopted machine, old1, already runs a service on 127.0.0.1:18482 (a stand-in, perl) and keeps its data in /var/lib/hello; take moves it under the mesh:"; \
	tok=$$($$mc token issue --new old1 --adopted 2>/dev/null); \
	$$mh join --broker $$url --token $$tok --node old1 --state $$dir/old1/state 2>/dev/null; \
	$$mh run --state $$dir/old1/state --root $$dir/old1/root --heartbeat 1s --no-module-users --no-overlay-interface >$$dir/old1.log 2>&1 & pids="$$pids $$!"; \
	mkdir -p $$dir/old1/root/var/lib/hello; echo 41 >$$dir/old1/root/var/lib/hello/starts; \
	perl -MIO::Socket::INET -e '$$s = IO::Socket::INET->new(LocalAddr => "127.0.0.1:18482", Listen => 5) or die "$$!\n"; print "listening\n"; close STDOUT; sleep' >$$dir/standin.out & \
	standin=$$!; pids="$$pids $$standin"; \
	waitfor 10 "the stand-in to listen on 18482" "grep -qs listening $$dir/standin.out"; \
	sed 's/"module": "hello"/"module": "guestbook"/; s/18480/18482/g' app/host/testdata/hello/mesh.json >$$dir/guestbook.json; \
	$$mc module add $$dir/guestbook.json >/dev/null 2>&1; \
	$(GO) build -o $$dir/old1/root/etc/mesh/modules/guestbook/bin/hello ./app/host/testdata/hello; \
	waitfor 30 "old1's facts" "$$mc node show old1 | grep -q '^  arch'" || { tail -20 $$dir/old1.log; exit 1; }; \
	echo "mesh-controller take old1 guestbook (the example module hello as guestbook, on 18482): a preview"; \
	$$mc take old1 guestbook >$$dir/preview.txt; sed 's/^/  /' $$dir/preview.txt; \
	digest=$$(awk '$$1 == "digest:" {print $$2}' $$dir/preview.txt); \
	echo "confirmed: mesh-controller take old1 guestbook --yes $$digest"; \
	$$mc take old1 guestbook --yes $$digest >$$dir/took.txt; sed -n 's/^took /  took /p' $$dir/took.txt; \
	gb() { $$mc node show old1 | grep '^  guestbook .* ready ' | tr -s ' '; }; \
	waitfor 60 "guestbook ready on old1" "gb | grep -q ready" || { tail -20 $$dir/old1.log; exit 1; }; echo " $$(gb)"; \
	waitfor 30 "the stand-in to end" "! kill -0 $$standin 2>/dev/null"; st=0; wait $$standin || st=$$?; \
	[ $$st -eq 143 ] || { echo "the stand-in was not ended by SIGTERM (status $$st)"; exit 1; }; \
	[ "$$(cat $$dir/old1/root/var/lib/hello/starts)" = 42 ] || { echo "guestbook did not start on the data that was there"; exit 1; }; \
	echo "  the stand-in (pid $$standin) ended by its host's SIGTERM (status 143); guestbook started on the data there: its 42nd start"; \
	$$mc plan old1 | grep '^  why: taken ' | sed 's/^ *why:/  plan old1, why:/'; \
	$$mc plan old1 | grep -q '^  why: taken by a person' || { echo "plan old1 does not say guestbook was taken"; exit 1; }; \
	echo; echo "now web1's host stops, and web2 is declared something it cannot apply:"; \
	waitfor 30 "web1's heartbeat interval" "$$mc node show web1 --json | grep -q '\"heartbeat_interval_s\": 1,'"; \
	kill $$pid_web1; : > $$dir/web2/root/opt; \
	echo '{"modules": [{"module": "broken", "version": "1.0.0", "data": [{"name": "d", "path": "/opt/d", "precious": "costly"}]}]}' > $$dir/broken.json; \
	$$mc declare web2 $$dir/broken.json --why "the demo shows a failed apply" >/dev/null 2>&1; \
	waitfor 60 "web1 silent and web2's apply failed" '$$mc doctor run >/dev/null 2>&1; $$mc conditions 2>/dev/null | grep -q node.silent/web1 && $$mc conditions 2>/dev/null | grep -q node.apply-failed/web2'; \
	$$mc doctor run 2>/dev/null | head -1; echo; $$mc status 2>/dev/null; echo; $$mc durations --kind apply; echo; $$mc healers | tail -n +3; echo; $$mc hand-acts; echo; \
	$$mc board --listen 127.0.0.1:0 > $$dir/board.out & pids="$$pids $$!"; \
	waitfor 30 "the board's address" "grep -q '^board:' $$dir/board.out"; \
	board=$$(sed -n 's/^board: //p' $$dir/board.out); echo "the board at $$board shows:"; \
	curl -s $$board | grep -o '<h2>[^<]*</h2>' | sed 's/<[^>]*>//g; s/^/  /'; \
	echo; echo "demo done: stopping the hosts and the controller"


# demo-ha: a failover on one laptop. A broker cluster of three nats-server processes (built from
# the module in go.mod, each configured as 'broker show --config' prints), two controllers serving
# from the same stores (SQLite files here; every context's MESH_STORE_<CONTEXT> a postgres:// URL
# when the controllers are on two machines), a host running the example module. One server of the
# three is killed, then the serving controller with kill -9: the standby takes over within the
# lease bound, and the host's module keeps running (same pid). Fails when a step fails.
demo-ha: build nats-server
	@set -eu; dir=$$(mktemp -d); export MESH_DATA=$$dir/controller; mc=$(BIN)/mesh-controller; mh=$(BIN)/mesh-host; ns=$(BIN)/nats-server; \
	pids=""; trap 'kill $$pids 2>/dev/null || true; wait 2>/dev/null || true; rm -rf $$dir' EXIT; \
	fail() { echo "demo-ha: $$*" >&2; for f in $$dir/*.log; do echo "--- $$f" >&2; tail -15 $$f >&2; done; exit 1; }; \
	waitline() { for i in $$(seq $$3); do grep -q "$$2" $$1 && return 0; sleep 0.1; done; return 1; }; \
	$$mc migrate >/dev/null 2>&1; \
	base=$$(( 20000 + $$$$ % 20000 )); routes=""; urls=""; \
	for i in 1 2 3; do routes="$$routes$${routes:+,}nats-route://127.0.0.1:$$((base + 10 + i))"; urls="$$urls$${urls:+,}nats://127.0.0.1:$$((base + i))"; done; \
	echo "a broker cluster: three nats-server processes, each configured by mesh-controller broker show --config"; \
	for i in 1 2 3; do \
		$$mc broker show --config --name nats$$i --listen 127.0.0.1:$$((base + i)) --cluster-listen 127.0.0.1:$$((base + 10 + i)) \
			--routes $$routes --dir $$dir/nats$$i > $$dir/nats$$i.conf; \
		$$ns -c $$dir/nats$$i.conf >$$dir/nats$$i.log 2>&1 & pids="$$pids $$!"; eval "nats$$i=$$!"; \
	done; \
	for i in 1 2 3; do waitline $$dir/nats$$i.log 'Server is ready' 150 || fail "nats$$i did not start"; done; \
	echo "  $$urls"; export MESH_BROKER=$$urls; \
	$$mc serve >$$dir/a.log 2>&1 & a=$$!; pids="$$pids $$a"; \
	waitline $$dir/a.log '^ready' 150 || fail "the first controller is not ready"; \
	$$mc serve >$$dir/b.log 2>&1 & b=$$!; pids="$$pids $$b"; \
	waitline $$dir/b.log '^standby:' 100 || fail "the second controller does not stand by"; \
	echo "controller A (pid $$a): $$(grep '^ready' $$dir/a.log)"; echo "controller B (pid $$b): $$(grep '^standby:' $$dir/b.log)"; \
	$$mc broker show | grep '^serving' | sed 's/^/  /'; \
	echo; echo "a host, web1, running the example module hello:"; \
	tok=$$($$mc token issue --new web1 2>/dev/null); \
	$$mh join --broker $$urls --token $$tok --node web1 --state $$dir/web1/state 2>/dev/null; \
	$(GO) build -o $$dir/web1/root/etc/mesh/modules/hello/bin/hello ./app/host/testdata/hello; \
	$$mh run --state $$dir/web1/state --root $$dir/web1/root --heartbeat 1s --no-module-users --no-overlay-interface >$$dir/web1.log 2>&1 & pids="$$pids $$!"; \
	$$mc module add app/host/testdata/hello/mesh.json >/dev/null 2>&1; $$mc assign web1 hello >/dev/null 2>&1; \
	state() { $$mc node show web1 | grep '^  hello ' | tr -s ' '; }; \
	for i in $$(seq 150); do state | grep -q ' ready ' && break; sleep 0.1; done; \
	state | grep -q ' ready ' || fail "hello is not ready on web1"; echo " $$(state)"; \
	pid=$$(state | sed -n 's/.*pid \([0-9]*\).*/\1/p'); \
	echo; echo "kill -9 $$nats1 (nats1, one server of three): the controllers and web1 go on through the other two"; kill -9 $$nats1; \
	heard() { $$mc node show web1 --json | sed -n 's/.*"last_heard": "\([^"]*\)".*/\1/p' | head -1; }; \
	was=$$(heard); for i in $$(seq 100); do [ "$$(heard)" != "$$was" ] && break; sleep 0.1; done; \
	[ "$$(heard)" != "$$was" ] || fail "web1 was not heard after nats1 went"; echo "  web1 heard at $$(heard)"; \
	echo; echo "kill -9 $$a (controller A, serving):"; kill -9 $$a; start=$$(date +%s%N); \
	waitline $$dir/b.log '^ready' 160 || fail "the standby did not take over within 16 s"; \
	echo "  controller B serves $$(( ($$(date +%s%N) - start) / 1000000 )) ms after the kill: $$(grep '^ready' $$dir/b.log)"; \
	$$mc broker show | grep '^serving' | sed 's/^/  /'; \
	echo; echo "the host kept its module running (pid $$pid), and applies what is declared after the failover:"; \
	kill -0 $$pid || fail "hello (pid $$pid) is gone"; \
	$$mc push web1 --why "the demo declares after the failover" | sed 's/^/  /'; \
	for i in $$(seq 100); do [ -n "$$($$mc node list --json | grep '"behind": false')" ] && break; sleep 0.1; done; \
	[ -n "$$($$mc node list --json | grep '"behind": false')" ] || fail "web1 did not apply its declaration"; \
	echo " $$(state)"; [ "$$(state | sed -n 's/.*pid \([0-9]*\).*/\1/p')" = "$$pid" ] || fail "hello's pid changed"; \
	$$mc node list | sed 's/^/  /'; \
	echo; echo "demo-ha done: stopping the host, the controller and the broker cluster"

# make test needs a few programs besides Go: Debian's chromium (the board is
# tested in a real browser), sqlite3 (a test opens the stores beside a
# serving controller, as a person inspecting them would), jq and curl (the
# README's walkthrough, run as a test, uses them), perl (the README's
# adopted machine runs a line of it as the service already there; Debian's
# perl-base has it, always installed), and postgresql (every
# store test runs again on a real PostgreSQL: scripts/with-postgres starts
# one as an unprivileged user in a temporary directory and stops it after,
# whatever the tests' outcome), nftables and iproute2 (the packet filter a
# converged node gets is checked by nft and applied in a network namespace
# joined by a veth pair), and wireguard-tools (the overlay's interfaces are
# read back with wg), and restic (the backup module and every host back data
# sets up with the real restic, and a test opens a repository with a stock
# restic and its password alone), and zsh and fish (the scripts
# 'completion zsh' and 'completion fish' print are loaded by the real
# shells). When missing and run as root (as CI is), they are installed
# without recommends and nothing else on the system is changed; otherwise
# one line says what to install.
TOOLS := chromium sqlite3 jq curl git perl restic zsh fish python3
# Tools whose Debian package is named otherwise, as tool:package, looked
# for in /usr/sbin and /sbin too: the filter test runs nft and ip (network
# namespaces, a veth pair) as root; the overlay's test reads its
# interfaces with wg and checks its configuration with wg-quick, both of
# wireguard-tools, and enters a host's namespaces with nsenter (util-linux);
# the services' units are checked by systemd-analyze verify (systemd);
# the release's .deb is read by dpkg-deb and installed by dpkg -i (dpkg).
TOOL_PACKAGES := nft:nftables ip:iproute2 wg:wireguard-tools nsenter:util-linux systemd-analyze:systemd dpkg-deb:dpkg
# PostgreSQL's server programs are not on PATH: Debian keeps them by version.
PG_INITDB = $(firstword $(wildcard /usr/lib/postgresql/*/bin/initdb))

# MESH_HOST_OVERLAY_INTERFACE=false: the hosts tests run in the machine's own
# network namespace (the README's walkthrough, the demo's) write their
# overlay's configuration and bring no mesh0 up on the machine; the overlay's
# own test brings them up in namespaces of their own.
#
# Each run goes through gotestsum (the version below, installed into bin/
# through the Go module proxy on first use): a line a package, every failed
# test's output, and "DONE N tests, N skipped, N failures in T"; its exit
# status is go test's. The last line, failed or not, is both runs' count,
# "tests: N passed, N failed, N skipped" (scripts/test-summary), and make
# test fails when either run did. Every test's time is kept in
# bin/test-main.json and bin/test-race.json: 'bin/gotestsum tool slowest
# --jsonfile bin/test-main.json' lists the slowest.
#
# The race run is the end-to-end tests whose concurrency is in this
# process (controller, broker, hosts, supervisor, archives, builds'
# lifecycles), not those whose time goes elsewhere: a build's cold go build
# in the builder's sandbox, one host's thousand listeners, a disk too
# small, the hosts upgrading themselves (real mesh-host processes; their
# controller's side is the roll-outs' driver, raced by TestMesh_RollOut), the
# same mesh on PostgreSQL or a NATS cluster (the controller's code is the
# SQLite runs'), restic's backups and restores (RACE_SKIP).
# -timeout 14m only stops a hang: cmd/mesh-controller, the longest package,
# took 10 minutes on this 2-core machine at a load of 10.
# The end-to-end tests run four at a time (-parallel 4): each mostly waits
# on hosts and timers (app/e2e took 350 s of wall for 173 s of CPU one at
# a time, 178 s four at a time); under the race detector they are CPU's,
# and run one at a time as before.
GOTESTSUM := gotest.tools/gotestsum@v1.13.0
# TEST_FIRST are named before ./... so that go test starts them first: the
# longest package (cmd/mesh-controller, 6 minutes) then runs beside the
# rest rather than after most of it (a 590 s run, its start at 220 s).
TEST_FIRST := ./cmd/mesh-controller/ ./app/e2e/
TEST_ENV  := MESH_TEST_TOOLS=1 MESH_HOST_OVERLAY_INTERFACE=false MESH_NATS_SERVER=$(CURDIR)/$(BIN)/nats-server MESH_PROMTOOL=$(CURDIR)/$(BIN)/promtool
RACE_RUN  := TestMesh_|TestTake_|TestConverge_|TestUnmanagedListener|TestAlertWebhook_|TestUpgrade_|TestBackup_|TestData_|TestRunning_|TestSupervisor_|TestSweep_|TestBuild_|TestBuildPlan_|TestCollection_|TestArchives|TestRunner_BeatsWhileApplying
RACE_SKIP := TestUnmanagedListener_OneANode|TestBuild_SourceToRunningModule|TestBuild_ArchiveTooLargeForTheHostsDisk|TestHostUpgrade_|TestMesh_PostgresRestart|TestMesh_OnPostgres|TestMesh_Cluster|TestBackup_KilledMidway|TestBackup_AskedAndReported|TestBackup_RestoreServesTheSameHosts
test: tools nats-server gotestsum previous-release redocly promtool
	@rm -f $(BIN)/test-main.json $(BIN)/test-race.json; status=0; \
	echo "every test (go test ./..., beside a throw-away PostgreSQL)"; \
	scripts/with-postgres env $(TEST_ENV) $(BIN)/gotestsum --format pkgname --jsonfile $(BIN)/test-main.json -- -count=1 -parallel 4 -timeout 14m $(TEST_FIRST) ./... || status=$$?; \
	if [ $$status = 0 ]; then \
		echo "the end-to-end tests again under the race detector (it needs cgo: for tests only, the binaries stay static)"; \
		scripts/with-postgres env CGO_ENABLED=1 $(TEST_ENV) $(BIN)/gotestsum --format pkgname --jsonfile $(BIN)/test-race.json -- -race -count=1 -parallel 1 -timeout 10m \
			-run '$(RACE_RUN)' -skip '$(RACE_SKIP)' ./app/ ./app/e2e/ ./app/host/ || status=$$?; \
	fi; \
	scripts/test-summary $(BIN)/test-main.json $(BIN)/test-race.json; exit $$status

# redocly: the OpenAPI linter (Redocly's CLI) that TestAPI_OpenAPILint runs
# on app/api/openapi.json, of the version REDOCLY names, from the npm
# registry into bin/npm (git-ignored with bin/) with the machine's npm;
# nothing to do when that version is there.
REDOCLY := @redocly/cli@2.77.0
redocly:
	@grep -qs '"version": "$(lastword $(subst @, ,$(REDOCLY)))"' $(BIN)/npm/node_modules/@redocly/cli/package.json && exit 0; \
	command -v npm >/dev/null || { echo "make test needs npm (Node.js's, from the npm registry: $(REDOCLY), the OpenAPI linter); install Node.js and run make test again"; exit 1; }; \
	echo "make test: installing $(REDOCLY) into $(BIN)/npm (the OpenAPI document's linter)"; \
	npm install --prefix $(BIN)/npm --no-save --no-audit --no-fund --loglevel=error $(REDOCLY) >/dev/null

# gotestsum: make test's runner, of the version GOTESTSUM names, into bin/.
gotestsum:
	@[ -x $(BIN)/gotestsum ] && $(BIN)/gotestsum --version | grep -q " $(lastword $(subst @, ,$(GOTESTSUM)))$$" || \
		GOBIN=$(CURDIR)/$(BIN) CGO_ENABLED=0 $(GO) install $(GOTESTSUM)

tools:
	@missing=""; for t in $(TOOLS); do command -v $$t >/dev/null 2>&1 || missing="$$missing $$t"; done; \
	for tp in $(TOOL_PACKAGES); do t=$${tp%%:*}; command -v $$t >/dev/null 2>&1 || [ -x /usr/sbin/$$t ] || [ -x /sbin/$$t ] || missing="$$missing $${tp#*:}"; done; \
	[ -n "$(PG_INITDB)" ] || missing="$$missing postgresql"; \
	[ -z "$$missing" ] && exit 0; \
	if [ "$$(id -u)" != 0 ]; then echo "make test needs:$$missing; install them (apt-get install --no-install-recommends$$missing) and run make test again"; exit 1; fi; \
	echo "make test: installing Debian's$$missing for the tests (no recommends, nothing upgraded)"; \
	{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --no-upgrade$$missing; } >/dev/null 2>&1 \
		|| { echo "make test: could not install$$missing: install them (apt-get install --no-install-recommends$$missing) and run make test again"; exit 1; }

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change: $$out"; exit 1; fi
	$(GO) vet ./...

# bench: the in-process benchmarks, then the controller under load with
# 1,000 and 10,000 simulated hosts, each 10,000-host figure printed beside
# its floor measured in the same run (a bare nats-server holding the same
# connections, the signatures' cost, …), then 50,000 hosts through a
# cluster of three nats-servers with the stores on PostgreSQL (about half
# an hour; not part of make test). Each controller leaves its CPU profiles
# (one per phase) and heap profile and its log in bench-profiles/ (go tool
# pprof reads them). MESH_BENCH_HOSTS=N and MESH_BENCH_SCALE_HOSTS=N change
# the counts.
bench: tools
	$(GO) test -run '^$$' -bench . -benchmem ./...
	MESH_BENCH=1 MESH_BENCH_PROFILES=$(CURDIR)/bench-profiles $(GO) test -count=1 -timeout 60m -run TestLoad -v ./app/loadbench/
	scripts/with-postgres env MESH_BENCH=1 MESH_BENCH_POSTGRES=1 MESH_BENCH_PROFILES=$(CURDIR)/bench-profiles $(GO) test -count=1 -timeout 60m -run TestScaleCluster -v ./app/loadbench/

# bench-postgres: make bench's load scenarios with every context's store on
# a throw-away PostgreSQL (scripts/with-postgres; fsync off, as for the tests).
bench-postgres: tools
	scripts/with-postgres env MESH_BENCH=1 MESH_BENCH_POSTGRES=1 $(GO) test -count=1 -timeout 60m -run TestLoad -v ./app/loadbench/

# soak: 1,000 simulated hosts beating every second for 5 minutes against the
# real binaries; prints what the stores grew by, per beat and per table, and
# one host's cost a day at 10-second beats (MESH_SOAK_HOSTS, _MINUTES, _BEAT).
soak:
	MESH_SOAK=1 $(GO) test -count=1 -timeout 60m -run TestSoak -v ./app/loadbench/

# measure-archives: a 50 MiB archive of incompressible bytes built by the
# builder module and rolled out together to 20 real hosts: the time until
# every host has it, and the controller's and hosts' peak RSS (about a
# minute; not part of make test). MESH_MEASURE_MB and MESH_MEASURE_HOSTS
# change the size and the count.
measure-archives: build
	scripts/measure-archive-fanout

clean:
	rm -rf $(BIN)

# fuzz the manifest parser (module check); new corpus entries land in the Go cache:
# copy the interesting ones to contexts/inventory/manifest/testdata/fuzz/ to keep them.
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime 60s ./contexts/inventory/manifest/
