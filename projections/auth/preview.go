package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"strings"
)

// Preview is what a preview token says: a guest port of a sandbox, at the
// sandbox's token generation, until Expires (Unix seconds). Like sandbox
// tokens it is stored nowhere: the node secret signs it, and the caller
// checks it against the state on every use.
type Preview struct {
	Sandbox string
	Gen     uint64
	Port    uint16
	Expires int64
}

// previewLen is the fixed part of an encoded Preview: gen, port, expires.
const previewLen = 8 + 2 + 8

// previewDomain separates preview signatures from every other use of the
// node secret.
const previewDomain = "sbxlog preview v1\x00"

// PreviewToken signs p: base64url(gen, port, expires, sandbox id) "."
// base64url(HMAC-SHA256(node secret, domain || that payload)), URL-safe so
// it sits in a path segment.
func (a *Authenticator) PreviewToken(p Preview) string {
	b := make([]byte, previewLen, previewLen+len(p.Sandbox))
	binary.BigEndian.PutUint64(b[0:], p.Gen)
	binary.BigEndian.PutUint16(b[8:], p.Port)
	binary.BigEndian.PutUint64(b[10:], uint64(p.Expires))
	b = append(b, p.Sandbox...)
	enc := base64.RawURLEncoding.EncodeToString(b)
	return enc + "." + base64.RawURLEncoding.EncodeToString(a.previewMAC(enc))
}

// VerifyPreview returns what token says when the node secret signed it; it
// does not look at the expiry or the state.
func (a *Authenticator) VerifyPreview(token string) (Preview, bool) {
	enc, sig, ok := strings.Cut(token, ".")
	if !ok {
		return Preview{}, false
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(got, a.previewMAC(enc)) {
		return Preview{}, false
	}
	b, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil || len(b) <= previewLen {
		return Preview{}, false
	}
	return Preview{
		Gen: binary.BigEndian.Uint64(b[0:]), Port: binary.BigEndian.Uint16(b[8:]),
		Expires: int64(binary.BigEndian.Uint64(b[10:])), Sandbox: string(b[previewLen:]),
	}, true
}

func (a *Authenticator) previewMAC(enc string) []byte {
	m := hmac.New(sha256.New, a.secret)
	m.Write([]byte(previewDomain))
	m.Write([]byte(enc))
	return m.Sum(nil)
}

// IsSandboxToken reports whether token is sandbox id's token at generation
// gen (constant-time).
func (a *Authenticator) IsSandboxToken(token, id string, gen uint64) bool {
	return subtle.ConstantTimeCompare([]byte(token), []byte(a.SandboxToken(id, gen))) == 1
}
