package node

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/sbxlog/sbxlog/executors/egressmeter"
	"github.com/sbxlog/sbxlog/executors/netguard"
	"github.com/sbxlog/sbxlog/fsm"
	"github.com/sbxlog/sbxlog/fsm/egress"
	"github.com/sbxlog/sbxlog/projections/api"
	"github.com/sbxlog/sbxlog/projections/egressview"
	"github.com/sbxlog/sbxlog/projections/envseal"
)

// Guarded egress's policy side, as the node assembles it: the env key
// (<data_dir>/env.key) that seals claims' env values before they reach
// the log, the internal-address guard, the accounting meter (its records
// proposed as RecordEgressUsage, one per sandbox per interval), and the
// view the egress proxy asks per connection (Node.Egress). The config's
// egress classes seed the class set until the API changes it, as its
// tenants do; its pools' policies come with its pools on a first start.

// EgressConfig configures guarded egress.
type EgressConfig struct {
	// Secrets is the secret registry ({name, header, value_env}): the
	// names rules may inject; the node's values are read from the process
	// environment at start.
	Secrets []egress.SecretSpec
	// InternalAllow are egress_internal_allow entries ("CIDR" or
	// "CIDR:port,port"): internal destinations the proxy may reach.
	InternalAllow []string
	// Classes seed the egress classes until the API first changes them.
	Classes []fsm.EgressClassSpec
	// PoolEgress are the policies of Config.Pools, applied with them on a
	// first start.
	PoolEgress map[fsm.PoolKey]*egress.Policy
	// UsageEvery is how often the egress usage is recorded (default
	// egressmeter.DefaultEvery).
	UsageEvery time.Duration
	// CanIntercept: the node's proxy holds the CA intercept rules need.
	CanIntercept bool
	// Getenv reads the secrets' node values (default os.Getenv).
	Getenv func(string) string
}

// startEgress builds the egress view once the engine exists; the key was
// loaded with the data dir (step 1).
func (n *Node) startEgress(metrics *api.Metrics) error {
	ec := n.cfg.Egress
	hostAddrs, err := netguard.LocalAddrs()
	if err != nil {
		return fmt.Errorf("egress: host addresses: %w", err)
	}
	guard, err := netguard.New(ec.InternalAllow, hostAddrs)
	if err != nil {
		return fmt.Errorf("egress: %w", err)
	}
	meter := egressmeter.New(egressmeter.Options{Every: ec.UsageEvery, Observer: metrics, Record: n.recordUsage, Log: n.zl})
	if n.Egress, err = egressview.New(n.Engine, egressview.Options{Key: n.EnvKey, Secrets: ec.Secrets, Getenv: ec.Getenv, Guard: guard, Meter: meter}); err != nil {
		return fmt.Errorf("egress: %w", err)
	}
	return nil
}

// loadEnvKey loads (creating) the env key in the data dir.
func loadEnvKey(dataDir string) (*envseal.Key, error) {
	return envseal.LoadOrCreate(filepath.Join(dataDir, envseal.FileName))
}

// recordUsage proposes the meter's records.
func (n *Node) recordUsage(ctx context.Context, u []fsm.EgressUsage) error {
	_, err := n.Engine.Propose(ctx, fsm.RecordEgressUsage{Meta: n.Engine.Meta(), Usage: u})
	return err
}

// runMeter records egress usage every interval until the node stops.
func (n *Node) runMeter() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-n.stopped
		cancel()
	}()
	n.Egress.Meter().Run(ctx, func(err error) {
		n.zl.Warn().Err(err).Msg("egress usage not recorded yet; kept for the next flush")
	})
}

// flushMeter records what the meter holds, on the way down.
func (n *Node) flushMeter() {
	if n.Egress == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := n.Egress.Meter().Flush(ctx); err != nil {
		n.zl.Warn().Err(err).Msg("egress usage of the last interval not recorded")
	}
}

// applyEgressClasses proposes the config's classes (a no-op once the API
// owns the set, or when they are the state's already).
func (n *Node) applyEgressClasses(ctx context.Context) error {
	var byAPI bool
	n.Engine.View(func(st *fsm.State) { byAPI = st.EgressClassesOwnedByAPI() })
	if byAPI {
		if len(n.cfg.Egress.Classes) > 0 {
			n.zl.Warn().Int("config_classes", len(n.cfg.Egress.Classes)).
				Msg("the config's egress classes are ignored: /v1/egress/classes owns them (GET /v1/egress/classes lists them)")
		}
		return nil
	}
	res, err := n.Engine.Propose(ctx, fsm.SetEgressClasses{Meta: n.Engine.Meta(), Classes: n.cfg.Egress.Classes, FromConfig: true})
	if err != nil {
		return fmt.Errorf("apply configured egress classes: %w", err)
	}
	if len(res.Events) > 0 {
		n.zl.Info().Int("egress_classes", len(n.cfg.Egress.Classes)).Msg("egress classes from the config applied; once /v1/egress/classes changes them, the API owns them")
	}
	return nil
}
