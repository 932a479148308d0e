# sbxlog — see README.md. Every target works on a fresh Debian machine with Go.
GO        ?= go
BIN       := bin
PKGS      := ./...
TESTFLAGS ?= -race -timeout 14m
# FUZZTIME is how long `make test` fuzzes each API handler target. Go spends
# up to -fuzzminimizetime (60 s by default) shrinking every input that finds
# new coverage, without fuzzing meanwhile: in a 10 s run that left most of
# the time at 0 execs/s, so minimising is capped (a crasher is still
# minimised within the cap, and always written to testdata/fuzz).
FUZZTIME  ?= 10s
FUZZMIN   ?= 1s
# The test targets pipe go test into cmd/testsummary: pipefail makes a
# failure of either side fail the target.
SHELL      := /bin/bash
.SHELLFLAGS := -o pipefail -ec

.PHONY: all build test e2e bench lint clean guest

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build -buildvcs=auto -o $(BIN)/ ./cmd/...

# test's output is `go test -json` read by cmd/testsummary: each package's
# line as go test prints it, failed tests' output, then every skipped test
# with its reason (plain go test hides skips) and the counts and duration.
test:
	$(GO) vet $(PKGS)
	$(GO) test -json $(TESTFLAGS) $(PKGS) | $(GO) run ./cmd/testsummary
	$(GO) test -run '^$$' -fuzz '^FuzzClaim$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMIN) ./projections/api
	$(GO) test -run '^$$' -fuzz '^FuzzPutPools$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMIN) ./projections/api

# e2e is the real-guest suite: every test that boots a QEMU guest (TCG), which
# `make test` skips (executors/guest/guesttest: they run only with SBX_E2E=1).
# It reruns the other tests of these packages too (seconds to minutes).
# Needs the guests (`make guest`; the tests build them when missing).
E2EPKGS   ?= ./executors/qemu/... ./executors/guest/... ./cmd/e2e/... ./bench/agentbench/... ./bench/egressbench/... ./bench/qemubench/... ./bench/ckptbench/...
E2EFLAGS  ?= -race -timeout 60m
e2e:
	SBX_E2E=1 $(GO) test -json $(E2EFLAGS) $(E2EPKGS) | $(GO) run ./cmd/testsummary

# run starts sandboxd with its built-in defaults: data in ./data, one pool
# "default" (net none, size small, warm 2), API on 127.0.0.1:7777, no NATS
# needed. Where QEMU is installed (apt-get install -y qemu-system-x86
# qemu-utils busybox-static cpio mmdebstrap, and run as root) it builds the
# guests (make guest, cached) and runs real Linux guests (-hypervisor qemu):
# template "default" is Debian (bash, python3, git, SSH on port 22),
# "busybox" the initramfs alone; otherwise hypervisor auto
# (cloud-hypervisor from PATH, else chsim from bin/, whose guest is
# simulated). On its first start it generates a root token into
# ./data/api.token, which sbxctl run from this directory reads: in another
# shell, bin/sbxctl claim --template default.
.PHONY: run
run: build
	@if command -v qemu-system-x86_64 >/dev/null 2>&1 && \
		echo "make run: QEMU found: preparing the guests (make guest: kernel, initramfs, Debian template; cached in $${SBX_CACHE:-$$HOME/.cache/sbxlog}, a first build takes 1-2 minutes)..." && \
		./executors/guest/build.sh >/dev/null && ./executors/guest/template.sh default >/dev/null; then \
		echo "make run: QEMU and the guests are here: real Linux guests (-hypervisor qemu), template default is Debian"; \
		exec ./$(BIN)/sandboxd -hypervisor qemu; \
	else \
		echo "make run: no QEMU guest (as root: apt-get install -y qemu-system-x86 qemu-utils busybox-static cpio mmdebstrap, then make run again): hypervisor auto, chsim's simulated guest unless cloud-hypervisor is installed"; \
		exec ./$(BIN)/sandboxd; \
	fi

# bench runs every benchmark section in bench/, prints a table per section and
# rewrites those sections of docs/benchmarks.md. BENCH=name[,name] runs a subset.
bench:
	$(GO) run ./bench -out docs/benchmarks.md $(if $(BENCH),-only $(BENCH),)

# chaos is the kill -9 campaign (bench/chaos): a random workload against
# sandboxd with chsim while it is SIGKILLed at random moments (also crashed at
# recipe steps, its VMMs killed, chsim faults on), then checks that nothing
# acknowledged was lost and nothing was orphaned. Defaults: 10 minutes and at
# least 50 kills; CHAOS_FLAGS passes flags, e.g. CHAOS_FLAGS='-seed 7 -duration 2m'.
# Exits non-zero on any violation. The result of record is in docs/reliability.md.
.PHONY: chaos
chaos:
	$(GO) run ./bench/chaos $(CHAOS_FLAGS)

# guest builds the QEMU guests, cached by content hash: the kernel (Debian's
# cloud kernel package) and the busybox initramfs with the project's agent
# (template "busybox", the fast test guest), then the Debian root disk of
# template "default" (executors/guest/template.sh; needs root, mmdebstrap,
# qemu-utils). guest-busybox builds the first part alone.
.PHONY: guest-busybox template
guest: guest-busybox
	./executors/guest/template.sh default

guest-busybox:
	./executors/guest/build.sh

# template builds a template of one's own from Debian packages (packages in,
# template out), served as NAME by sandboxd -hypervisor qemu after a restart:
#   make template NAME=py EXTRA_PACKAGES="python3-numpy python3-requests"
template: guest-busybox
	EXTRA_PACKAGES="$(EXTRA_PACKAGES)" ./executors/guest/template.sh $(or $(NAME),default)

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet $(PKGS)

# clean removes the binaries (bin/). clean-data removes what `make run` made
# besides them: ./data (the op log, snapshots, the root token, the VMs' run
# dirs), refused while a sandboxd holds it (data/sandboxd.lock). Run
# `bin/sbxctl down` before stopping sandboxd: its VMs outlive it (a restart
# adopts them), and a removed data dir leaves them nothing to be adopted by.
clean:
	rm -rf $(BIN)

.PHONY: clean-data
clean-data:
	@if [ -e data/sandboxd.lock ] && ! flock -n data/sandboxd.lock true; then \
		echo "make clean-data: a sandboxd holds ./data (pid $$(cat data/sandboxd.lock)): stop it first (bin/sbxctl down, then Ctrl-C)"; exit 1; \
	fi
	rm -rf data
