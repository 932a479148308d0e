// Package envseal seals the values of claims' env, so no secret is in the
// op log, its snapshots, the replication stream or the journals in the
// clear: the API seals each value before it proposes it, and only the
// owning node, which holds the key, opens it (for GET env, the guest's
// env and the egress proxy's secrets).
//
// Contract:
//   - The key is 32 random bytes in a file of the data dir (env.key,
//     0600, created on first use), never in the log. The AES-256-GCM key
//     is derived from it (HMAC-SHA256 with this package's label), and its
//     id is a fingerprint of that key, so a sealed value says which key
//     sealed it.
//   - A sealed value is "<key id>:<base64url(nonce || ciphertext+tag)>",
//     with a random 96-bit nonce, and bound (as GCM's additional data) to
//     the claim and the entry name: a ciphertext moved to another claim or
//     name does not open.
//   - Losing the key file loses the values (they do not open: ErrOpen);
//     the entries stay, and are rewritten by the next PUT env.
package envseal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/sbxlog/sbxlog/projections/auth"
)

// FileName is the key file's name in the data dir.
const FileName = "env.key"

// ErrOpen means a sealed value does not open: another node's or a lost
// key, a value moved to another claim or name, or a corrupted one.
var ErrOpen = errors.New("envseal: sealed value does not open")

// Key seals and opens env values. Safe for concurrent use.
type Key struct {
	id   string
	aead cipher.AEAD
}

// LoadOrCreate reads the key file at path, creating it (0600) if missing.
func LoadOrCreate(path string) (*Key, error) {
	raw, err := auth.LoadOrCreateSecret(path)
	if err != nil {
		return nil, fmt.Errorf("envseal: %w", err)
	}
	return FromBytes(raw)
}

// FromBytes builds a key from the key file's content (at least 16 bytes).
func FromBytes(raw []byte) (*Key, error) {
	if len(raw) < 16 {
		return nil, fmt.Errorf("envseal: key of %d bytes, want at least 16", len(raw))
	}
	mac := hmac.New(sha256.New, raw)
	mac.Write([]byte("sbxlog env seal v1"))
	k := mac.Sum(nil)
	block, err := aes.NewCipher(k)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	id := sha256.Sum256(append([]byte("sbxlog env key id\x00"), k...))
	return &Key{id: hex.EncodeToString(id[:4]), aead: aead}, nil
}

// ID is the key's id, the prefix of what it seals.
func (k *Key) ID() string { return k.id }

func aad(claim, name string) []byte {
	return []byte("sbxlog env v1\x00" + claim + "\x00" + name)
}

// Seal seals value for entry name of claim.
func (k *Key) Seal(claim, name string, value []byte) (string, error) {
	nonce := make([]byte, k.aead.NonceSize(), k.aead.NonceSize()+len(value)+k.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return "", fmt.Errorf("envseal: %w", err)
	}
	out := k.aead.Seal(nonce, nonce, value, aad(claim, name))
	return k.id + ":" + base64.RawURLEncoding.EncodeToString(out), nil
}

// Open opens what Seal returned for the same claim and name.
func (k *Key) Open(claim, name, sealed string) ([]byte, error) {
	id, body, ok := strings.Cut(sealed, ":")
	if !ok || id != k.id {
		return nil, fmt.Errorf("%w: sealed under key %q, this node's is %q", ErrOpen, id, k.id)
	}
	raw, err := base64.RawURLEncoding.DecodeString(body)
	if err != nil || len(raw) < k.aead.NonceSize()+k.aead.Overhead() {
		return nil, fmt.Errorf("%w: malformed", ErrOpen)
	}
	n := k.aead.NonceSize()
	v, err := k.aead.Open(nil, raw[:n], raw[n:], aad(claim, name))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrOpen, err)
	}
	return v, nil
}
