// Command sandboxd is the per-host daemon: it keeps pools of warm Cloud
// Hypervisor VMs, serves claims over HTTP, and records every change in its op
// log. See README.md and docs/operations.md.
//
// This package turns the config file and flags into a node.Config and a
// hypervisor; package cmd/sandboxd/node owns the start and stop order (open
// the log, replication, rebuild, identity and pools, driver, reconcile, API
// and executors, pending intents and loops, ready, serve; SIGTERM the
// reverse).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/sbxlog/sbxlog/cmd/buildinfo"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

// systemConfig is the config file sandboxd reads when neither -config nor
// $SBX_CONFIG names one, if it exists.
const systemConfig = "/etc/sandboxd/config.json"

// defaultConfigPath is -config's default: $SBX_CONFIG, else systemConfig
// when it exists, else "" (the built-in defaults).
func defaultConfigPath() string {
	if p := os.Getenv("SBX_CONFIG"); p != "" {
		return p
	}
	if _, err := os.Stat(systemConfig); err == nil {
		return systemConfig
	}
	return ""
}

func run(args []string) int {
	fs := flag.NewFlagSet("sandboxd", flag.ContinueOnError)
	configPath := fs.String("config", defaultConfigPath(), "JSON config file (default $SBX_CONFIG, else "+systemConfig+" when it exists, else built-in defaults; see docs/operations.md)")
	listen := fs.String("listen", "", "HTTP listen address (overrides config)")
	dataDir := fs.String("data", "", "data directory (overrides config)")
	nodeID := fs.String("node-id", "", "node id (overrides config)")
	hypervisor := fs.String("hypervisor", "", "auto | cloud-hypervisor | chsim | qemu (overrides config)")
	natsURL := fs.String("nats-url", "", "use an existing NATS cluster instead of the embedded server")
	noNATS := fs.Bool("no-nats", false, "disable replication")
	natsPort := fs.Int("nats-port", 0, "embedded NATS port (overrides config; default listen port + 1000, or a free one)")
	apiToken := fs.String("api-token", "", "root API token (overrides config; also SBX_API_TOKEN)")
	logLevel := fs.String("log-level", "", "log level: debug, info, warn, error (overrides config and $SBX_LOG_LEVEL)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *showVersion {
		fmt.Println(buildinfo.Read().Line("sandboxd"))
		return 0
	}
	cfg, err := loadConfig(*configPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandboxd:", err)
		return 2
	}
	set := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	set(&cfg.Listen, *listen)
	set(&cfg.DataDir, *dataDir)
	set(&cfg.NodeID, *nodeID)
	set(&cfg.Hypervisor, *hypervisor)
	set(&cfg.NATS.URL, *natsURL)
	set(&cfg.APIToken, os.Getenv("SBX_API_TOKEN"))
	set(&cfg.APIToken, *apiToken)
	set(&cfg.LogLevel, os.Getenv("SBX_LOG_LEVEL"))
	set(&cfg.LogLevel, *logLevel)
	if *natsPort != 0 {
		cfg.NATS.Port = *natsPort
	}
	if *noNATS {
		cfg.NATS.Disabled = true
	}
	cfg.defaultToken()
	if err := cfg.finish(); err != nil {
		fmt.Fprintln(os.Stderr, "sandboxd: invalid config:", err)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	n, zl, err := start(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandboxd:", err)
		return 1
	}
	<-ctx.Done()
	if err := n.Stop(); err != nil {
		zl.Error().Err(err).Msg("shutdown")
		return 1
	}
	return 0
}
