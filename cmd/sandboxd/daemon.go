package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/sbxlog/sbxlog/cmd/sandboxd/node"
	"github.com/sbxlog/sbxlog/projections/api"
)

// logLevels are the levels log_level, --log-level and $SBX_LOG_LEVEL take.
var logLevels = []string{"debug", "info", "warn", "error"}

// newLogger is sandboxd's logger at level (validated by Config.finish;
// "" is info): on a terminal zerolog's console format, for a person;
// anywhere else JSON lines, for a collector. Durations are written with
// their unit ("1.5s"). Lines carry no component of their own: the parts
// that have one (replication, nats, pebble) name it, once.
func newLogger(level string, w *os.File) zerolog.Logger {
	zerolog.DurationFieldFormat = zerolog.DurationFormatString
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		lvl = zerolog.InfoLevel
	}
	var out io.Writer = w
	if isTerminal(w) {
		out = zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339}
	}
	return zerolog.New(out).Level(lvl).With().Timestamp().Logger()
}

// isTerminal says whether f is a terminal.
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// start turns the config into a node (package node owns the start order)
// and returns once it serves HTTP.
func start(ctx context.Context, cfg Config) (*node.Node, zerolog.Logger, error) {
	zl := newLogger(cfg.LogLevel, os.Stderr)
	if cfg.nodeIDFrom != "" {
		zl.Info().Str("node", cfg.NodeID).Str("hostname", cfg.nodeIDFrom).
			Msgf("node_id not configured: using %q, derived from the host name (letters, digits, '-' and '_' kept, anything else '-'); set node_id to choose it", cfg.NodeID)
	}
	// The data dir first: one this process cannot use is reported as such,
	// not as the token file's error (the token file is in it by default).
	if err := node.PrepareDataDir(cfg.DataDir); err != nil {
		return nil, zl, err
	}
	rootToken := cfg.APIToken
	if rootToken == "" && cfg.APITokenFile != "" {
		path, err := filepath.Abs(cfg.APITokenFile)
		if err != nil {
			return nil, zl, err
		}
		var created bool
		if rootToken, created, err = loadOrCreateToken(path); err != nil {
			return nil, zl, err
		}
		verb := "read from"
		if created {
			verb = "generated into"
		}
		zl.Info().Str("api_token_file", path).Msgf("root API token %s %s; sbxctl reads data/api.token from its working directory (run it where you ran make run), else export SBX_API_TOKEN=$(cat %s)", verb, path, path)
	}
	if rootToken == "" {
		zl.Warn().Msg("no api_token configured: root-only routes answer 401 (/metrics is open, as the old daemon's)")
	}
	if err := cfg.openArchive(zl); err != nil {
		return nil, zl, err
	}
	hv, err := resolveHypervisor(cfg, zl)
	if err != nil {
		return nil, zl, err
	}
	nc := node.Config{
		DataDir: cfg.DataDir, NodeID: cfg.NodeID, Listen: cfg.Listen, OwnerAddr: cfg.OwnerAddr,
		RootToken: rootToken, Tenants: cfg.Tenants, MaxClaims: cfg.MaxClaims, Pools: cfg.poolSpecs(), Volumes: cfg.Volumes,
		RestartPolicy: cfg.restartPolicy(), Concurrency: cfg.RefillConcurrency,
		ReadHeaderTimeout: ms(cfg.HTTP.ReadHeaderTimeoutMS), IdleTimeout: ms(cfg.HTTP.IdleTimeoutMS),
		API: api.Config{BodyTimeout: ms(cfg.HTTP.BodyTimeoutMS), MetricsAuth: cfg.MetricsAuth, NoDashboard: cfg.noDashboard(),
			CheckpointTTL: time.Duration(cfg.CheckpointTTLHours) * time.Hour, MaxForkCount: cfg.MaxForkCount, Archive: cfg.archive != nil},
		Egress:        cfg.egressConfig(),
		PreviewListen: cfg.PreviewListen,
		DataPlane: api.DataPlane{
			RelayMemory: cfg.RelayMemoryBytes,
			Preview:     api.PreviewConfig{Advertise: cfg.PreviewAdvertise},
		},
		Log: zl,
	}
	if nc.Proxy, err = cfg.nodeProxy(); err != nil {
		return nil, zl, err
	}
	if !cfg.NATS.Disabled {
		nc.Replication = replicationConfig(cfg, zl)
	} else {
		zl.Info().Msg("replication disabled (nats.disabled / -no-nats)")
	}
	n, err := node.Start(ctx, nc, hv)
	return n, zl, err
}

// resolveHypervisor picks the VMM binary: auto prefers cloud-hypervisor from
// PATH and falls back to chsim (next to this binary, then PATH).
func resolveHypervisor(cfg Config, zl zerolog.Logger) (node.Hypervisor, error) {
	find := func(name string) string {
		if exe, err := os.Executable(); err == nil {
			p := filepath.Join(filepath.Dir(exe), name)
			if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
				return p
			}
		}
		if p, err := exec.LookPath(name); err == nil {
			if abs, err := filepath.Abs(p); err == nil {
				return abs
			}
		}
		return ""
	}
	switch cfg.Hypervisor {
	case "auto", "cloud-hypervisor":
		bin := cfg.CHBinary
		if bin == "" {
			if p, err := exec.LookPath("cloud-hypervisor"); err == nil {
				bin, _ = filepath.Abs(p)
			}
		}
		if bin != "" {
			return chHypervisor(cfg, "cloud-hypervisor", bin, zl), nil
		}
		if cfg.Hypervisor == "cloud-hypervisor" {
			return nil, errors.New("hypervisor cloud-hypervisor: binary not found in PATH (set ch_binary)")
		}
		fallthrough
	case "chsim":
		bin := find("chsim")
		if bin == "" {
			return nil, errors.New("no cloud-hypervisor binary and no chsim next to sandboxd or in PATH (run make build)")
		}
		return chHypervisor(cfg, "chsim", bin, zl), nil
	case "qemu":
		bin, err := resolveQEMU(cfg)
		if err != nil {
			return nil, err
		}
		return qemuHypervisor(cfg, bin, zl), nil
	}
	return nil, fmt.Errorf("unknown hypervisor %q", cfg.Hypervisor)
}
