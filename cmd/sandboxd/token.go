package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/sbxlog/sbxlog/executors/fsx"
	"os"
	"path/filepath"
	"strings"
)

// defaultTokenFile is where sandboxd started with its built-in defaults (no
// -config) and no api_token keeps its root token, relative to the data dir.
// sbxctl reads data/api.token from its working directory, so `make run` in
// one shell and sbxctl from the same directory in another need no set-up.
const defaultTokenFile = "api.token"

// defaultToken gives a config that names no root token, with or without a
// config file, the generated one in the data dir, so the node is usable at
// once (a config file that named no token used to turn root off: every
// call 401, a warning at start only).
func (c *Config) defaultToken() {
	if c.APIToken == "" && c.APITokenFile == "" {
		c.APITokenFile = filepath.Join(c.DataDir, defaultTokenFile)
	}
}

// loadOrCreateToken returns the root token in path: its first line. When
// the file does not exist it is created (mode 0600, fsynced, with its
// directory) holding a fresh random token, and created is true.
func loadOrCreateToken(path string) (token string, created bool, err error) {
	data, err := os.ReadFile(path)
	if err == nil {
		token, _, _ = strings.Cut(string(data), "\n")
		if token = strings.TrimSpace(token); token == "" {
			return "", false, fmt.Errorf("api token file %s is empty", path)
		}
		return token, false, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", false, fmt.Errorf("api token file: %w", err)
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", false, err
	}
	token = "sbxroot_" + hex.EncodeToString(b[:])
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", false, fmt.Errorf("api token file: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", false, fmt.Errorf("api token file: %w", err)
	}
	_, err = f.WriteString(token + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = fsx.SyncDir(filepath.Dir(path))
	}
	if err != nil {
		_ = os.Remove(path)
		return "", false, fmt.Errorf("api token file: %w", err)
	}
	return token, true, nil
}
