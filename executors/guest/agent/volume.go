package agent

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Volumes: a host-side volume is hot-plugged as a virtio-blk disk whose
// serial is the volume's name; the guest finds it by that serial and
// mounts it where the claim asked (the old daemon's convention:
// /volumes/<name> unless the claim named a mount).
//
//	mount <b64>        -> mount      wait for the disk with that serial, mkdir -p the
//	                                 mount point, mount it (read-only unless RW);
//	                                 already mounted there: done
//	umount <b64>       -> umount     unmount the mount point (never lazily: files open
//	                                 there fail it); not mounted: done
//
// <b64> is a VolumeMount as base64url JSON.
const (
	VerbMount   = "mount"
	VerbUnmount = "umount"
)

// VolumeMount is a mount or umount request.
type VolumeMount struct {
	// Serial is the disk's virtio serial (the volume's name).
	Serial string `json:"serial"`
	// Path is the mount point: absolute and clean.
	Path string `json:"path"`
	// RW mounts read-write; a read-only disk is mounted read-only anyway.
	RW bool `json:"rw,omitempty"`
}

var serialRe = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,19}$`)

// Validate checks a request before either side acts on it.
func (m VolumeMount) Validate() error {
	if !serialRe.MatchString(m.Serial) {
		return fmt.Errorf("volume mount: bad serial %q", m.Serial)
	}
	if !strings.HasPrefix(m.Path, "/") || m.Path == "/" || strings.Contains(m.Path, "/../") || strings.HasSuffix(m.Path, "/..") ||
		strings.ContainsAny(m.Path, "\x00\n") || len(m.Path) > 256 {
		return fmt.Errorf("volume mount: bad mount point %q", m.Path)
	}
	return nil
}

// EncodeVolumeMount is the argument of a mount or umount request.
func EncodeVolumeMount(m VolumeMount) (string, error) {
	if err := m.Validate(); err != nil {
		return "", err
	}
	return encodeArg(m)
}

// DecodeVolumeMount reads and validates a mount or umount argument.
func DecodeVolumeMount(arg string) (VolumeMount, error) {
	var m VolumeMount
	if err := decodeArg(arg, &m, true); err != nil {
		return m, fmt.Errorf("volume mount: %w", err)
	}
	return m, m.Validate()
}

// handleVolume answers a mount or umount request with do (nil: refused,
// as by an agent that predates volumes).
func handleVolume(verb string, args []string, do func(VolumeMount) error) (string, error) {
	if do == nil {
		return "", errors.New("this agent mounts no volumes")
	}
	if len(args) != 1 {
		return "", fmt.Errorf("usage: %s <base64url JSON>", verb)
	}
	m, err := DecodeVolumeMount(args[0])
	if err != nil {
		return "", err
	}
	if err := do(m); err != nil {
		return "", err
	}
	return verb, nil
}

// Mount asks the guest to mount the disk with m.Serial at m.Path.
func (c *Client) Mount(ctx context.Context, m VolumeMount) error {
	return c.volume(ctx, VerbMount, m)
}

// Unmount asks the guest to unmount m.Path.
func (c *Client) Unmount(ctx context.Context, m VolumeMount) error {
	return c.volume(ctx, VerbUnmount, m)
}

func (c *Client) volume(ctx context.Context, verb string, m VolumeMount) error {
	arg, err := EncodeVolumeMount(m)
	if err != nil {
		return err
	}
	resp, err := c.Do(ctx, verb, arg)
	if err != nil {
		return err
	}
	_, err = expect(resp, verb)
	return err
}
