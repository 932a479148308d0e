package qmp

import (
	"context"
	"fmt"
)

// Status is the answer of query-status.
type Status struct {
	Running bool   `json:"running"`
	Status  string `json:"status"` // RunState: "running", "paused", "inmigrate", "postmigrate", "prelaunch", ...
}

// QueryStatus returns the VM's run state.
func (c *Client) QueryStatus(ctx context.Context) (Status, error) {
	var st Status
	err := c.Execute(ctx, "query-status", nil, &st)
	return st, err
}

// Capability is one migration capability setting.
type Capability struct {
	Capability string `json:"capability"`
	State      bool   `json:"state"`
}

// SetMigrationCapabilities enables each named capability.
func (c *Client) SetMigrationCapabilities(ctx context.Context, names ...string) error {
	caps := make([]Capability, len(names))
	for i, n := range names {
		caps[i] = Capability{Capability: n, State: true}
	}
	return c.Execute(ctx, "migrate-set-capabilities", map[string]any{"capabilities": caps}, nil)
}

// MigrationInfo is the part of query-migrate's answer the driver reads.
type MigrationInfo struct {
	Status    string `json:"status"` // "none", "setup", "active", "completed", "failed", "cancelled", ...
	ErrorDesc string `json:"error-desc"`
	TotalTime int64  `json:"total-time"` // ms, set once completed (source side)
	RAM       *struct {
		Transferred int64 `json:"transferred"`
	} `json:"ram"`
}

// QueryMigrate returns the state of the current or last migration.
func (c *Client) QueryMigrate(ctx context.Context) (MigrationInfo, error) {
	var mi MigrationInfo
	err := c.Execute(ctx, "query-migrate", nil, &mi)
	return mi, err
}

// GetFD hands fd to QEMU under name, for a later "fd:<name>" migration URI.
func (c *Client) GetFD(ctx context.Context, name string, fd int) error {
	if name == "" {
		return fmt.Errorf("qmp: getfd: empty name")
	}
	return c.ExecuteFD(ctx, "getfd", map[string]string{"fdname": name}, nil, fd)
}
