package agent

import (
	"errors"
	"strings"
	"testing"
)

// The mount and umount verbs: decoded and validated before the guest's
// mounter runs, refused by an agent without one, errors passed back.
func TestVolumeVerbs(t *testing.T) {
	var got []VolumeMount
	s := newServer(t)
	s.Mount = func(m VolumeMount) error { got = append(got, m); return nil }
	s.Unmount = func(m VolumeMount) error {
		if m.Path == "/busy" {
			return errors.New("unmount /busy: device or resource busy")
		}
		got = append(got, m)
		return nil
	}
	enc := func(m VolumeMount) string {
		a, err := EncodeVolumeMount(m)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	ok := VolumeMount{Serial: "imagenet", Path: "/volumes/imagenet"}
	if r := s.Handle("#1 mount " + enc(ok)); r != "=1 mount" {
		t.Fatalf("mount: %q", r)
	}
	if r := s.Handle("umount " + enc(VolumeMount{Serial: "w", Path: "/busy"})); !strings.HasPrefix(r, "error umount ") || !strings.Contains(r, "busy") {
		t.Fatalf("busy umount: %q", r)
	}
	if r := s.Handle("umount " + enc(ok)); r != "umount" {
		t.Fatalf("umount: %q", r)
	}
	if len(got) != 2 || got[0] != ok || got[1] != ok {
		t.Fatalf("mounter saw %+v", got)
	}
	for _, bad := range []VolumeMount{{Serial: "Bad", Path: "/x"}, {Serial: "x", Path: "rel"}, {Serial: "x", Path: "/"}, {Serial: "x", Path: "/a/../etc"}} {
		if _, err := EncodeVolumeMount(bad); err == nil {
			t.Errorf("%+v encoded", bad)
		}
	}
	for _, line := range []string{"mount", "mount !!", "mount eyJzZXJpYWwiOiJ4IiwicGF0aCI6Ii94IiwiZXh0cmEiOjF9"} {
		if r := s.Handle(line); !strings.HasPrefix(r, "error mount ") {
			t.Errorf("%q answered %q", line, r)
		}
	}
	s.Mount = nil
	if r := s.Handle("mount " + enc(ok)); !strings.Contains(r, "mounts no volumes") {
		t.Fatalf("agent without a mounter: %q", r)
	}
}
