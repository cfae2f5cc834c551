# mesh-controller: one static binary. `make run` builds and starts it on the
# default data dir; `make test` runs every test. Nothing else needs installing
# but Go: modules come through the Go module proxy on first build.

GO       ?= go
BIN      := bin
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null)
LDFLAGS  := -s -w $(if $(VERSION),-X main.version=$(VERSION))
export CGO_ENABLED := 0

.PHONY: build run test lint bench clean

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/mesh-controller ./cmd/mesh-controller

# Until the daemon exists, run migrates the default data dir and prints help.
run: build
	$(BIN)/mesh-controller migrate
	$(BIN)/mesh-controller help

test:
	$(GO) test -count=1 -timeout 9m ./...

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change: $$out"; exit 1; fi
	$(GO) vet ./...

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

clean:
	rm -rf $(BIN)
