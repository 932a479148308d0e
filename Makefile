# sbxlog — see README.md. Every target works on a fresh Debian machine with Go.
GO        ?= go
BIN       := bin
PKGS      := ./...
TESTFLAGS ?= -race -timeout 14m
# FUZZTIME is how long `make test` fuzzes each API handler target.
FUZZTIME  ?= 10s

.PHONY: all build test bench lint clean guest

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/...

test:
	$(GO) vet $(PKGS)
	$(GO) test $(TESTFLAGS) $(PKGS)
	$(GO) test -run '^$$' -fuzz '^FuzzClaim$$' -fuzztime $(FUZZTIME) ./projections/api
	$(GO) test -run '^$$' -fuzz '^FuzzPutPools$$' -fuzztime $(FUZZTIME) ./projections/api

# bench runs every benchmark section in bench/, prints a table per section and
# rewrites those sections of docs/benchmarks.md. BENCH=name[,name] runs a subset.
bench:
	$(GO) run ./bench -out docs/benchmarks.md $(if $(BENCH),-only $(BENCH),)

# guest builds the QEMU test guest (kernel from Debian's cloud kernel package,
# busybox initramfs with the project's agent), cached by content hash.
guest:
	./guest/build.sh

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet $(PKGS)

clean:
	rm -rf $(BIN)
