// Package natsauth is how sbxlog's NATS clients (sandboxd's replication,
// sbxctl's follow, audit and usage) authenticate.
//
// The embedded server accepts one user, identified by an NKey: sandboxd
// generates the user's seed into <data_dir>/nats.nk (SeedFile, mode 0600)
// on its first start and gives the server only the public key. NKeys
// rather than a password or a token because the server challenges the
// client to sign a nonce: the secret never crosses the connection and the
// server holds nothing that would let anyone in, and the seed file is the
// one natscli reads as it is (nats --nkey data/nats.nk).
//
// An external server's credentials are a Config: user and password, a
// token, an NKey seed file or a creds file (JWT and seed), and TLS (a CA
// file, a client certificate and key). Options turns one into client
// options, checking the files first, and Describe names what is used
// without any secret.
package natsauth

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// SeedFileName is the embedded server's user seed, in the data dir.
const SeedFileName = "nats.nk"

// SeedFile is the seed file of the embedded server of a node whose data
// dir is dataDir.
func SeedFile(dataDir string) string { return filepath.Join(dataDir, SeedFileName) }

// ErrSeed means a seed file is missing, unreadable or not a user seed.
var ErrSeed = errors.New("natsauth: bad NKey seed file")

// NewUserSeed returns a fresh user seed (the file's content) and its
// public key.
func NewUserSeed() (seed []byte, public string, err error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, "", err
	}
	defer kp.Wipe()
	if seed, err = kp.Seed(); err != nil {
		return nil, "", err
	}
	public, err = kp.PublicKey()
	return append(seed, '\n'), public, err
}

// PublicKey reads a user seed file and returns its public key.
func PublicKey(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrSeed, err)
	}
	kp, err := nkeys.FromSeed(bytes.TrimSpace(b))
	if err != nil {
		return "", fmt.Errorf("%w: %s: %v", ErrSeed, path, err)
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil || !nkeys.IsValidPublicUserKey(pub) {
		return "", fmt.Errorf("%w: %s does not hold a user seed", ErrSeed, path)
	}
	return pub, nil
}

// Config is the credentials and TLS settings for a NATS server. At most one
// of user/password, token, NKey seed file and creds file may be set.
type Config struct {
	// User and Password: plain user authentication.
	User     string `json:"user,omitempty"`
	Password string `json:"password,omitempty"`
	// Token: token authentication.
	Token string `json:"token,omitempty"`
	// NKeySeedFile holds a user NKey seed (nsc, nk -gen user, or a node's
	// nats.nk).
	NKeySeedFile string `json:"nkey_seed_file,omitempty"`
	// CredsFile is a decentralised-auth creds file (user JWT and seed).
	CredsFile string `json:"creds_file,omitempty"`
	// TLSCA is a PEM file of the CAs the server's certificate must chain
	// to; TLSCert and TLSKey are a client certificate and its key (both or
	// neither). Any of them turns TLS on.
	TLSCA   string `json:"tls_ca,omitempty"`
	TLSCert string `json:"tls_cert,omitempty"`
	TLSKey  string `json:"tls_key,omitempty"`
}

// IsZero reports whether c sets nothing.
func (c Config) IsZero() bool { return c == Config{} }

// methods lists the authentication methods c sets.
func (c Config) methods() []string {
	var m []string
	if c.User != "" || c.Password != "" {
		m = append(m, "user/password")
	}
	if c.Token != "" {
		m = append(m, "token")
	}
	if c.NKeySeedFile != "" {
		m = append(m, "nkey seed file "+c.NKeySeedFile)
	}
	if c.CredsFile != "" {
		m = append(m, "creds file "+c.CredsFile)
	}
	return m
}

// Validate checks c without reading any file.
func (c Config) Validate() error {
	var errs []error
	if m := c.methods(); len(m) > 1 {
		errs = append(errs, fmt.Errorf("natsauth: more than one authentication method (%s): set one", strings.Join(m, ", ")))
	}
	if c.Password != "" && c.User == "" {
		errs = append(errs, errors.New("natsauth: a password needs a user"))
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		errs = append(errs, errors.New("natsauth: a TLS client certificate needs its key, and the key its certificate"))
	}
	return errors.Join(errs...)
}

// Describe says how c authenticates, naming files but never a secret.
func (c Config) Describe() string {
	d := "no credentials"
	switch m := c.methods(); {
	case len(m) == 1 && c.User != "":
		d = "user " + c.User
	case len(m) == 1:
		d = m[0]
	}
	if c.TLSCA != "" || c.TLSCert != "" {
		d += ", TLS"
		if c.TLSCert != "" {
			d += " with client certificate " + c.TLSCert
		}
	}
	return d
}

// Options are the client options for c. The files are read now, so a
// missing or bad one is reported here and not at the first connection.
func (c Config) Options() ([]nats.Option, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	var opts []nats.Option
	switch {
	case c.User != "":
		opts = append(opts, nats.UserInfo(c.User, c.Password))
	case c.Token != "":
		opts = append(opts, nats.Token(c.Token))
	case c.NKeySeedFile != "":
		if _, err := PublicKey(c.NKeySeedFile); err != nil {
			return nil, err
		}
		o, err := nats.NkeyOptionFromSeed(c.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrSeed, err)
		}
		opts = append(opts, o)
	case c.CredsFile != "":
		if _, err := os.Stat(c.CredsFile); err != nil {
			return nil, fmt.Errorf("natsauth: creds file: %w", err)
		}
		opts = append(opts, nats.UserCredentials(c.CredsFile))
	}
	if c.TLSCA != "" {
		opts = append(opts, nats.RootCAs(c.TLSCA))
	}
	if c.TLSCert != "" {
		opts = append(opts, nats.ClientCert(c.TLSCert, c.TLSKey))
	}
	// The option functions load certificates and keys: run them once on
	// scratch options to surface their errors.
	scratch := nats.GetDefaultOptions()
	for _, o := range opts {
		if err := o(&scratch); err != nil {
			return nil, fmt.Errorf("natsauth: %w", err)
		}
	}
	return opts, nil
}
