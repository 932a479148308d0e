package node

import (
	"context"
	"fmt"

	"github.com/sbxlog/sbxlog/fsm"
)

// applyVolumes records the config's volume catalog; the state decides
// whether it differs (an identical catalog is no event). A volume left out
// stays attached to the sandboxes that have it until they detach or end.
func (n *Node) applyVolumes(ctx context.Context) error {
	if _, err := n.Engine.Propose(ctx, fsm.ConfigureVolumes{Meta: n.Engine.Meta(), Volumes: n.cfg.Volumes}); err != nil {
		return fmt.Errorf("apply the volume catalog: %w", err)
	}
	return nil
}
